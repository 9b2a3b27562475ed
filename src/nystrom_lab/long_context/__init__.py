"""The long-context experiment: long models converted from a 512-token BERT-family checkpoint."""
