"""Hand-written migrations, one file per revision, numbered 0001, 0002, ..."""
