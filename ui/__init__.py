"""The Gradio interface, in pieces that app.py puts together. Depends on tasks/ and model/, never
the other way round."""
