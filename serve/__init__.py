"""The service every front end calls, with no Gradio in it. Stands on tasks/, engine/ and model/;
ui/ and app.py build the page on top of it and reach nothing below it: what they need of the
layers below is handed on here.

- limits.py: what a request may send (each setting's range) and how it is checked;
- messages.py: the messages a user can get, in their language;
- model_host.py: the model host that loads, switches and schedules; backend.py: the same host
  on other machines (a deployment's replicas); admission.py: the one queue every run of a host
  takes its turn in, whichever way it came;
- running.py: running a task as a stream of updates ending in its outcome record (outcome.py);
- comparing.py: one request run twice under one seed, the two sides apart in what it names (the
  adapter, the steering, the model, one setting);
- inspection.py: the Architecture tab's live view; apis.py, page_api.py, openai_api.py: the APIs;
  cluster.py, replica.py, ingress.py: the Ray Serve deployment, and what its clients get where a
  replica stops.
"""
from engine.quantize import QUANTIZATIONS
from tasks import DEFAULT_EXAMPLES, LANGUAGES, TASKS, Task
from tasks.dialogue import PERSONAS
from tasks.translation import goes_through_english

__all__ = ["QUANTIZATIONS", "TASKS", "Task", "LANGUAGES", "DEFAULT_EXAMPLES", "PERSONAS",
           "goes_through_english"]
