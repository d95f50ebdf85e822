"""Training memory: what one GPU will hold (``plan``) and what autograd keeps (``measure``)."""
