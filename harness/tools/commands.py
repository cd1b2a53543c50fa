"""The one builder of every command blockfuzz prints for a user to run.

``fuzz``'s ``replay:`` / ``explain:`` lines, ``repro``'s reproducer line,
``shrink``'s replay line, nightly findings (replay of the shrunk trace, and a
``fuzz`` re-run of the seed for crashes and findings alike), ``report.json``,
JUnit and the resume hint of an interrupted campaign all come from
:func:`command`, so what a report tells a user to run carries every setting
that produced the finding: runner, profile, target, faults, examples, device
and a pinned ``--config``.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

# Flags in the order they are printed; a flag whose value is None or False is left out.
FLAG_ORDER = ("runner", "seed", "examples", "time_budget", "profile", "config", "fault",
              "faults_from_trace", "no_faults", "target", "device", "workers", "shard",
              "out", "corpus", "seed_corpus", "seed_timeout", "examples_per_seed",
              "max_seeds", "releases", "release_cache")


def command(verb: str | None, *positionals, program: str = "blockfuzz", **flags) -> str:
    """A shell-quoted command line: ``program [verb] positionals --flag value ...``.

    flags: keyword per :data:`FLAG_ORDER` (``time_budget`` prints as
    ``--time-budget``); True prints the bare flag, a list or tuple repeats
    the flag once per item, None / False / empty leaves it out.  Raises
    ValueError for a flag the CLI does not have.
    """
    unknown = set(flags) - set(FLAG_ORDER)
    if unknown:
        raise ValueError(f"unknown flag(s): {', '.join(sorted(unknown))}")
    parts = shlex.split(program) + ([verb] if verb else []) + [str(p) for p in positionals]
    for name in FLAG_ORDER:
        value = flags.get(name)
        flag = "--" + name.replace("_", "-")
        if value is None or value is False or value == () or value == []:
            continue
        if value is True:
            parts.append(flag)
        elif isinstance(value, (list, tuple)):
            for item in value:
                parts += [flag, str(item)]
        else:
            parts += [flag, f"{value:g}" if isinstance(value, float) else str(value)]
    return shlex.join(parts)


@dataclass(frozen=True)
class RunSettings:
    """What produced a finding: everything a command needs to redo it.

    config: path of a pinned ``--config`` (None: geometry drawn per example);
    seed_corpus: the ``--seed-corpus`` directory examples could start from;
    device: the device it ran on (``cpu`` / ``cuda``); target ``gpu_impl`` is
    the default and is not printed; program: what runs blockfuzz (a campaign
    across vLLM releases prints the newest release's environment).
    """

    runner: str | None = None
    profile: str = "dev"
    target: str = "gpu_impl"
    faults: tuple[str, ...] = ()
    examples: int | None = None
    device: str | None = None
    config: str | None = None
    seed_corpus: str | None = None
    program: str = "blockfuzz"  # e.g. another environment's ``python -m harness``

    def _target(self) -> str | None:
        return None if self.target == "gpu_impl" else self.target

    def fuzz(self, seed: int, verb: str = "fuzz") -> str:
        """``blockfuzz fuzz`` that re-runs ``seed`` exactly as it ran."""
        # A target of one kind of config implies its runner (sglang): not a --runner.
        runner = None if self.runner == "sglang" else self.runner
        return command(verb, program=self.program, runner=runner, seed=seed,
                       examples=self.examples,
                       profile=self.profile, config=self.config, fault=sorted(self.faults),
                       seed_corpus=self.seed_corpus, target=self._target(), device=self.device)

    def on_trace(self, verb: str, path) -> str:
        """``blockfuzz replay|explain|shrink PATH`` with these faults, target, device."""
        return command(verb, path, program=self.program, fault=sorted(self.faults),
                       target=self._target(), device=self.device)

    def reproducer(self, script) -> str:
        """How to run a standalone reproducer script (its faults default to the trace's)."""
        return command(None, script, program="python", target=self._target(),
                       device=self.device)
