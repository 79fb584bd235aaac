"""The pipelines that make and judge a model: the corpus, pretraining, the task data splits,
fine-tuning the adapters, evaluation with its baselines, and the Pre-LN lab. Stands on tasks/,
engine/ and model/, beside serve/: neither imports the other."""
