"""squallrun puts this directory on PYTHONPATH for its sitecustomize."""
