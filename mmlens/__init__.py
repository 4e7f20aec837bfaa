"""mmlens: see how multimodal requests become tokens, blocks and routing decisions."""

__version__ = "0.1.0"
