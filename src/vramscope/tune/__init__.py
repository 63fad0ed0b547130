"""The tune floor: the largest batch (or longest sequence) that fits, found in a few real steps.

* :mod:`~vramscope.tune.search`: the pure search over a :class:`~vramscope.tune.search.MemoryProbe`.
* :mod:`~vramscope.tune.cuda`: torch's CUDA allocator as the probe; the device set up for the trials.
* :mod:`~vramscope.tune.trials`: one real step as a trial (OOMs caught and cleared; model and optimizer restored).
* :mod:`~vramscope.tune.find`: :func:`find_max_batch_size` and :func:`find_max_seq_len`, the public entry points.
* :mod:`~vramscope.tune.model_dir`: the QLoRA model and step built from a Hugging Face folder, then searched.
* :mod:`~vramscope.tune.command`: trials that are runs of the user's own training command.
* :mod:`~vramscope.tune.command_trial`: inside a trial child, its HF Trainer made to run one trial.
* :mod:`~vramscope.tune.trial_record`: the trial's request and record (the JSON the tuner and its children exchange).
* :mod:`~vramscope.tune.trial_eval`: inside a trial child, the evaluation pass after its last step.
* :mod:`~vramscope.tune.phase_limit`: which phase, the step or the evaluation, limits the answer.
* :mod:`~vramscope.tune.groups`: trial children end whole (their process groups), and a signal ends the running one.
* :mod:`~vramscope.tune.rehearse`: ``tune --gpus N -- CMD``, a run of N GPUs rehearsed on one as rank 0.
* :mod:`~vramscope.tune.launch_env`: the worker behind a launcher and the environment it gives rank 0 of N.
* :mod:`~vramscope.tune.rehearsal_pg`: inside a rehearsal child, torch's fake process group in place of NCCL.
* :mod:`~vramscope.tune.qlora`: build and step a real QLoRA/LoRA model (tune, calibration, the demo, benchmarks).
* :mod:`~vramscope.tune.calibrate`: ``plan --calibrate``, a few real steps fitted to the planner.

Imports nothing here: each module is imported by its path (torch only where a trial runs).
"""
