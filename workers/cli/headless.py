"""Headless training from launch.py's command line: a run of its workers with a progress line,
and the exit code (a rank of a torchrun job: torchrun.py). The flags are in flags.py, the run
they start or resume in new_run.py."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable

from agent.errors import UserError
from workers.cli.flags import build_parser
from workers.host.precision import describe_precision
from workers.host.signals import StopSignals
from workers.host.threads import check_threads, choose_threads

RACE_TABLE_S = 300.0  # a headless race prints its table this often


def _exit_code(interrupted: bool, stops: StopSignals | None) -> int:
    """0 for a run that ended or was stopped as asked (SIGTERM, an attached window), 130
    after Ctrl+C, as shells expect of an interrupted program."""
    if not interrupted:
        return 0
    return stops.exit_code if stops is not None and stops.first is not None else 130


def run_workers(args: argparse.Namespace, stops: StopSignals | None = None) -> int:
    from workers.cli.new_run import new_run_from_args, resume_from_args
    from workers.training.process import DOES_NOT_FIT
    from workers.training.progress import WorkersProgress
    from workers.training.schedule import steps_warning

    server = _bind_server(args)  # a port in use is refused before anything is written
    if args.resume:
        run = resume_from_args(args)
    else:
        run = new_run_from_args(args, default_workers=1).create()  # --workers 0 is refused
        warning = steps_warning(run.cfg)
        if warning:
            print(warning, file=sys.stderr)
    packs = run.settings.packs
    threads = choose_threads(len(packs), run.settings.threads_per_worker or None)
    shape = "" if run.settings.pack == 1 else f" in {len(packs)} pack{'s' * (len(packs) > 1)}"
    print(
        f"{run.settings.workers} worker{'s' * (run.settings.workers > 1)}{shape} on "
        f"{run.cfg.task}; run directory {run.path}\n"
        f"{threads.describe()}\n{describe_precision(run.cfg.bf16, run.cfg.device)}",
        file=sys.stderr,
    )
    if server is not None:
        server.start(run.path, args.read_only, new_token=args.new_token)
        print(server.instructions(), file=sys.stderr)
    progress = WorkersProgress(run.cfg.steps, run.cfg.resolved_pretrain_updates, not args.quiet)
    interrupted = False
    next_table = time.monotonic() + RACE_TABLE_S
    try:
        run.start()
        while any(w["alive"] for w in run.workers.progress()) or run.workers.restarting:
            time.sleep(0.5)  # requests from an attached window are served within this
            if time.monotonic() >= next_table and not args.quiet:
                next_table += RACE_TABLE_S
                _print_race(run, progress.write)
            for line in server.notices() if server is not None else ():
                progress.write(line)
            if _serve_requests(run, progress.write):  # a stop asked for: exit code 0
                progress.write("stopping, as an attached window asked...")
                run.stop()
                break
            for line in run.notices():  # a worker died, restarts, a knob record refused
                progress.write(line)
            progress.update(run.workers.progress())
        progress.update(run.workers.progress(), force=True)
        run.check_run_dir()
        for line in run.notices():  # what the last moments brought (a vanished directory)
            progress.write(line)
    except KeyboardInterrupt:
        interrupted = True
        progress.write("stopping: each worker writes a checkpoint...")
        run.stop()
    finally:
        progress.close()
        if server is not None:
            server.stop()
    if run.gone:  # said above; nothing to continue from where it was
        return 1
    _print_race(run, lambda text: print(text, file=sys.stderr))
    if any(w["exitcode"] == DOES_NOT_FIT for w in run.workers.progress()):
        return 1  # said above (the worker's line): the run cannot go on as it is
    print(f"{run.summary(interrupted)}; continue with --resume {run.path}", file=sys.stderr)
    return _exit_code(interrupted, stops)


def _bind_server(args: argparse.Namespace):
    """The run's server, bound (--serve), or None."""
    if args.serve is None:
        return None
    from workers.remote.server import RunServer

    return RunServer(args.serve_host, args.serve)


def _print_race(run, say: Callable[[str], None]) -> None:
    """The race table, when the run races."""
    from workers.race.text import race_of

    table = race_of(run.path, run.race.record(), run.workers.progress(), run.cfg)
    if table:
        say(f"race, best first:\n{table}")


def _serve_requests(run, say: Callable[[str], None]) -> bool:
    """Serve an attached window's requests, saying so; True when one asked to stop."""
    stop = False
    from workers.rundir.requests import describe

    for request in run.serve_requests():
        say(f"attached window asked: {describe(request)}")
        stop = stop or request.action == "stop"
    return stop


def main(argv: list[str]) -> int:
    stops = StopSignals()
    try:
        args = build_parser().parse_args(argv)
        if not args.headless:
            raise UserError("the window is opened by launch.py (this entry point is headless)")
        if args.attach or args.connect:
            raise UserError("--attach and --connect open the window: leave out --headless")
        check_threads(args.threads)
        stops.install()  # Ctrl+C and SIGTERM: a clean stop from here on
        from workers.cli.new_run import check_run_flags

        check_run_flags(args)
        from workers.cli.torchrun import run_rank, torchrun_rank

        if torchrun_rank() is not None:  # started by torchrun: this is one rank of a job
            return run_rank(args)
        return run_workers(args, stops)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # before training began: nothing to save
        print("interrupted", file=sys.stderr)
        return _exit_code(True, stops)
