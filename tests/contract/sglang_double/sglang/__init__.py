"""Test double of SGLang's package: only the names slime imports (see ../README.md)."""
