"""The service every front end calls, with no Gradio in it: what a request may send and how it is
checked (running.py), the model host that loads, switches and schedules (model_host.py), running
a task as a stream of updates ending in its outcome record (outcome.py), and the messages a user
can get, in their language (messages.py). ui/ builds the page and the Gradio API on top of it.
"""
