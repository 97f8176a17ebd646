"""The embedded worlds: the fictional demo encyclopedia (with its scripted expert) and the real-text benchmark."""
