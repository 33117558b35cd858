"""Images for models that see them: reading image input (image_input, torch-free) and the vision encoders."""
