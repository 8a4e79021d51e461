"""Corpus of decode-step spellings the ``replayssm`` backend must find (and decoys it must not)."""
