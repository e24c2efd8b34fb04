"""xlnet: XLNet pretraining and finetuning from raw text, in PyTorch."""

__version__ = "0.1.0"
