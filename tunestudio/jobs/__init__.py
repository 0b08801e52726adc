"""The parent's side of jobs. Never imports torch or the HF libraries."""
