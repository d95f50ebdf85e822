"""Training memory: what one GPU will hold, term by term, before anything starts (``plan``)."""
