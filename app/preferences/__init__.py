"""App-wide preferences (one INI file), the theme they choose, and the dialog that edits them."""
