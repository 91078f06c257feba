"""The ops-box terminal UI (Textual)."""
