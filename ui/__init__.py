"""The Gradio interface, in pieces that app.py puts together. Stands on serve/ alone (never on what
lies below it: tasks/, engine/, model/), and nothing below imports it."""
