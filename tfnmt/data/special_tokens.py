"""The ids every vocabulary reserves (SentencePiece is trained with them: tokenizer.py)."""
PAD_ID = 0  # padding; never predicted, masked out of attention and the loss
UNK_ID = 1
BOS_ID = 2  # starts every decoder input
EOS_ID = 3  # ends every source and target
