"""`taurl serve-tinker`: the Tinker training API, served by taurl's learner and local engine.

The unmodified ``tinker`` SDK (0.38.0) talks to it through ``base_url``: LoRA training
clients (``forward``, ``forward_backward`` with cross_entropy, importance_sampling and ppo,
``optim_step``, ``save_state`` / ``load_state``, ``save_weights_for_sampler``), sampling
clients (``sample``, ``compute_logprobs``) and ``tinker://`` checkpoints in a run directory.
Modules: `wire` (protobuf, zstd, futures' JSON), `futures`, `sessions`, `trainer` (a training
client's model), `losses`, `sampler`, `checkpoints`, `records`, `service`, `app` (routes),
`server` (`TinkerServer`: uvicorn), `cli`. docs/tinker.md says what differs from the hosted
service.
"""
