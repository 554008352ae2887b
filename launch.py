"""python launch.py --config configs/default.yaml [--set KEY=VALUE ...] [--output-dir DIR] [--resume DIR]"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
import warnings
from pathlib import Path

EXIT_BAD_INPUT = 2


class Parser(argparse.ArgumentParser):
    def error(self, message):  # one line and exit 2, like every other bad input
        print(f"error: {message}; see python launch.py --help", file=sys.stderr)
        sys.exit(EXIT_BAD_INPUT)


def saved_records(folder: Path | None) -> int:
    """How many records a report folder holds on disk (0: none, or no such folder)."""
    try:
        with open(Path(folder) / "samples.jsonl", "rb") as handle:
            return sum(1 for line in handle if line.strip())
    except (OSError, TypeError):
        return 0


def write_error_log(text: str, folder: Path | None) -> Path | None:
    """The traceback of an internal error, in the run's report folder (a --resume folder too, where the error came
    before the run reopened it), in the working directory only where no report folder exists yet, or where the
    folder cannot be written: the absolute path it went to, None where neither could be written."""
    places = [folder] if folder is not None and folder.is_dir() else []
    for place in places + [Path.cwd()]:
        log = (place / "error.log").absolute()
        try:
            log.write_text(text)
        except OSError:
            continue
        return log
    return None


def main(argv: list[str] | None = None) -> int:
    # SIGTERM is Ctrl-C from the start (the imports below take seconds): never a silent death with 143
    from utils import raise_interrupt

    previous_term = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        return _main(argv)
    except KeyboardInterrupt:  # during the imports, before the run's own handling of it
        print("interrupted before any measurement", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous_term)


def _main(argv: list[str] | None) -> int:
    parser = Parser(description="Benchmark speculative decoding from a YAML experiment.")
    parser.add_argument("--config", help="experiment YAML (configs/default.yaml is the offline demo)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key by its dotted path, value in YAML (repeatable)")
    parser.add_argument("--output-dir", help="write the report exactly here (default results/<name>-<time>/)")
    parser.add_argument("--resume", metavar="DIR", help="continue an interrupted run in DIR; finished batches are kept")
    args = parser.parse_args(argv)

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)  # one warning per int8 matmul otherwise
    from rich.console import Console

    from utils import UserError
    from utils.config import load_config

    out_dir = None
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 150)
    try:
        if args.resume and args.output_dir:
            raise UserError("--resume DIR already names the folder; drop --output-dir")
        if not args.config and not args.resume:
            raise UserError("--config FILE is required (try --config configs/default.yaml)")
        config_path = args.config or Path(args.resume) / "config.yaml"
        config, raw = load_config(config_path, args.overrides)
        if args.resume:
            out_dir = Path(args.resume)
        elif args.output_dir:
            out_dir = Path(args.output_dir)
        else:
            out_dir = Path(__file__).parent / "results" / f"{config.name}-{time.strftime('%Y%m%d-%H%M%S')}"

        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        from runner import Experiment

        code = Experiment(config, raw, out_dir, console, resume=bool(args.resume)).run()
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # outside the run's own handling of it (before the run started, or as it ended)
        folder = out_dir or (Path(args.resume) if args.resume else None)
        saved = saved_records(folder)
        if not saved:
            print("interrupted before any measurement", file=sys.stderr)
            return 130
        print(f"interrupted: the {saved} records saved in {folder} are kept; continue with --resume {folder}",
              file=sys.stderr)
        print(folder)
        return 130
    except Exception as error:  # a bug, not bad input: one line here, the traceback in a file
        import traceback

        log = write_error_log(traceback.format_exc(), out_dir or (Path(args.resume) if args.resume else None))
        where = f"traceback in {log}" if log else "no error.log could be written"
        print(f"internal error: {type(error).__name__}: {' '.join(str(error).split())[:300]} "
              f"({where}; please report it)", file=sys.stderr)
        return 1
    print(out_dir)
    return code


if __name__ == "__main__":
    sys.exit(main())
