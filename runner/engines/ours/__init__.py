"""Our engine: the methods of decode/methods run by runner/session.py's Session, in this process (LocalExecutor)
or on Ray workers (runner/cluster.py RayExecutor, config cluster.backend: ray). The home engine: it loads the prompts
and tokenizer every engine takes (and no model when none of its methods is in the config)."""
from __future__ import annotations

from runner.engines.base import Engine
from runner.plan import Unit
from runner.session import Session


class LocalExecutor:
    """Runs the units in this process, one after another, and yields each one finished."""

    def __init__(self, config, device, status=None):
        self.session = Session(config, device, worker=None, status=status)
        self.environments: list[tuple[dict, str]] = []
        self.workers_info: dict = {}
        self.notes: list[str] = []

    def __enter__(self):
        self.session.load()
        self.loaded = self.session
        self.num_prompts = len(self.session.prompt_set.prompts)
        return self

    def __exit__(self, *exc):
        import gc

        gc.unfreeze()  # runner/session.py quiet_heap's: the engine's objects are the collector's again
        return False

    def release(self) -> None:
        """The models out of memory while another engine runs; run() loads them again if needed."""
        if self.session.target is not None:
            self.session.release_models()

    def run(self, units: list[Unit], done: set):
        reloaded = self.session.released
        if reloaded:
            self.session.load()
        for unit in units:
            try:
                result = self.session.run_unit(unit, done)
                if reloaded:  # said where it happened: a run of one repeat never loads them again
                    result.notes.append("our engine's models were loaded again for a later repeat, warmed up and "
                                        "probed anew")
                    reloaded = False
            except KeyboardInterrupt as interrupt:  # a serving unit runs minutes: keep the points it finished
                partial = getattr(interrupt, "partial", None)
                if partial is not None and partial.rows:
                    yield unit, partial
                raise
            yield unit, result


class OurEngine(Engine):
    name, title = "ours", "our engine"
    executor: LocalExecutor | None = None  # or runner/cluster.py's RayExecutor (no release: never beside another engine)

    def start(self, session) -> None:
        if self.config.cluster.backend == "ray":
            from runner.cluster import RayExecutor

            self.executor = RayExecutor(self.config, self.device, self.raw_config, self.status)
        else:
            self.executor = LocalExecutor(self.config, self.device, self.status)
        self.executor.__enter__()
        self.session = self.executor.loaded
        self.environments = self.executor.environments
        self.workers_info, self.notes = self.executor.workers_info, self.executor.notes

    @property
    def num_prompts(self) -> int:
        return self.executor.num_prompts

    def run(self, units: list[Unit], done: set):
        yield from self.executor.run(units, done)

    def info(self) -> dict:
        """engine.compile: each compiled model's counters so far (decode/static_kv.py CompiledModel.summary: graphs,
        CUDA graph recordings and skips, buffer sets per capacity), so a report says what its graphs did."""
        if not isinstance(self.executor, LocalExecutor) or self.executor.session.released:
            return {}
        compiled = self.executor.session.compiled_models()
        return {"compiled": {role: model.summary() for role, model in compiled.items()}} if compiled else {}

    def release(self, by: Engine) -> str | None:
        if not isinstance(self.executor, LocalExecutor):  # Ray's workers hold the models elsewhere
            return None
        if self.executor.session.target is None:  # none loaded (every method another engine's) or released before
            return None
        self.executor.release()
        return f"our engine's models were released while {by.title} ran ({by.title} loads its own copies)"

    def close(self) -> None:
        executor, self.executor = self.executor, None
        if executor is not None:
            executor.__exit__(None, None, None)


ENGINE = OurEngine
