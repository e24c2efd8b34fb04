from xlnetcli.cli import main

main()
