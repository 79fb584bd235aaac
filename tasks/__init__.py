"""The tasks the app offers, in tab order, and how to run one (see base.py for what a task is):
each task's prompt format, decoding defaults and post-processing, nothing else. Stands on engine/
and model/; serve/ and train/ use it."""
from .base import Prompt, Task, TaskDone, TaskUpdate, first_sentences, run_task
from .dialogue import DIALOGUE, DialogueInputs, next_prompt
from .generation import GENERATE, GenerateInputs
from .summarization import SUMMARIZE, SummarizeInputs
from .translation import DEFAULT_EXAMPLES, LANGUAGES, TRANSLATE, TranslateInputs

TASKS: dict[str, Task] = {task.name: task for task in (GENERATE, DIALOGUE, TRANSLATE, SUMMARIZE)}

__all__ = ["TASKS", "Task", "Prompt", "TaskUpdate", "TaskDone", "run_task", "first_sentences",
           "GenerateInputs", "DialogueInputs", "next_prompt", "TranslateInputs", "SummarizeInputs", "LANGUAGES", "DEFAULT_EXAMPLES"]
