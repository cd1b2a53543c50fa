"""A target over a model runner built on gpu_impl's runner shell
(:class:`gpu_impl.runner_shell.RunnerShell`): ops go to the runner's scheduler-
and forward-facing methods, observations come from :meth:`RunnerShell.snapshot`.

gpu_impl's own runners and the vLLM adapter's runners are both wrapped by it;
an adapter for another engine's block-table classes needs only its runner.
"""

from __future__ import annotations

from harness.core.observation import Observation, rows_indexed_by


class RunnerTarget:
    """name: the registered target name; runner: a ``RunnerShell`` subclass instance
    built for ``runner.config`` (a ``reference.RunnerConfig``)."""

    def __init__(self, name: str, runner):
        self.name = name
        self.runner = runner
        self.config = runner.config

    def add(self, req, blocks, prompt_len):
        self.runner.add_request(req, blocks, prompt_len)

    def append(self, req, blocks):
        self.runner.append_blocks(req, blocks)

    def remove(self, req):
        self.runner.finish_request(req)

    def condense(self):
        self.runner.condense()

    def swap(self, i, j):
        self.runner.swap_states(i, j)

    def kv_load(self, req):
        self.runner.kv_load(req)

    def rollback(self, req, num_tokens):
        self.runner.rollback_tokens(req, num_tokens)

    def step(self, scheduled, cudagraph_mode, accepted=None):
        self.runner.execute_model(scheduled, cudagraph_mode, accepted)

    def dummy_run(self, num_reqs, num_tokens, cudagraph_mode):
        self.runner.dummy_run(num_reqs, num_tokens, cudagraph_mode)

    def observe(self) -> Observation:
        return Observation(runner=self.config.runner,
                           rows_indexed_by=rows_indexed_by(self.config.runner),
                           **self.runner.snapshot())
