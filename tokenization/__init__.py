"""corpus-tokenization."""
