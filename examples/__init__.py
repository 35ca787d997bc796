"""Out-of-tree backends a reviewer can check with ``python -m refimpl check --backend-class``."""
