"""Fine-tuning and evaluation: GLUE's eight tasks and SQuAD 2.0, the papers' grid x five seeds on Ray
Tune, the median per configuration and the best configuration, tracked in MLflow (docs/finetuning.md).

    tasks.py     the tasks, their metrics, and readers for the hub and the offline mirror (GLUE TSV, SQuAD JSON)
    metrics.py   accuracy, F1, MCC, Pearson/Spearman, SQuAD 2.0 EM/F1 (official), the GLUE average
    features.py  [CLS] a [SEP] b [SEP] with the run's vocabulary; length-grouped, dynamically padded batches
    squad.py     SQuAD 2.0 windows (doc stride), no-answer via [CLS], n-best span decoding
    data.py      a task ready for trials: read, capped, tokenised, fingerprinted
    model.py     the exported main Transformer + a classification / regression / span head
    trial.py     one trial: fine-tune with one configuration and seed, evaluate after every epoch
    grid.py      configurations, trial specs, median per configuration and selection, the result store
    tuning.py    trials on Ray Tune (resources, retries, actor reuse)
    track.py     MLflow parents (run, task, checkpoint, label fraction) and children (trials)
    protocol.py  the whole protocol for one pretraining run; stages/finetune.py calls it

Modules are imported on use: this file stays light.
"""
