"""Token layout: families, formulas, processor configs, tokenizers, composition, hashing, images."""
