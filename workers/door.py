"""The one door into workers/ for the window (viewer/) and for bench/ where it drives whole runs:
the run API and the commands it carries out (run.do), the request that makes, resumes or
attaches a run, and the types and words the window shows. It only re-exports names (a name
costs nothing per frame); tests/test_house.py holds that viewer/ imports nothing else of
workers/, and that nothing in workers/ imports this.

A module, not workers/__init__.py: a package's __init__ runs on every import of any module in
it, so each worker process would load the whole front door, and sub-packages would import it
in a cycle.
"""

from workers.cli.flags import add_common_flags, add_config_flags, build_parser
from workers.cli.headless import RACE_TABLE_S
from workers.cli.new_run import (
    RUNS,
    NewRun,
    check_run_flags,
    config_from_args,
    default_run_dir,
    demo_requested,
    new_run_from_dialog,
    resume_from_args,
    window_run_from_args,
)
from workers.cli.parser import CliParser
from workers.cli.presets import (
    CPU_PLANNING,
    cuda_available,
    demo_preset,
    model_sizes,
    tasks,
)
from workers.host.precision import describe_precision
from workers.host.threads import WINDOW_THREADS, apply_threads, check_threads
from workers.race.control import MAX_LANES, check_race, sharing
from workers.race.replicas import t_975
from workers.race.rows import LaneRow, RaceTable
from workers.race.scores import SMOOTH
from workers.race.table import RaceTracker
from workers.race.text import (
    level_text,
    race_of,
    race_top,
    reached_text,
    row_cells,
    summary_lines,
)
from workers.race.verdict import MIN_EPISODES
from workers.remote.connected import ConnectedRun
from workers.remote.link import Link
from workers.remote.server import RunServer
from workers.remote.wire import split_url, token_from
from workers.run.base import BaseRun
from workers.run.commands import (
    AddWorker,
    Checkpoint,
    ChooseShowcase,
    Command,
    MakeMontage,
    OpenShowcase,
    Outcome,
    Pause,
    PauseRendering,
    PinEpisode,
    Promote,
    RemoveWorker,
    ResetShowcase,
    RestartWorker,
    Resume,
    SetKnobs,
    ShowPanes,
    StartRace,
    Stop,
)
from workers.run.owner import Run, resumable
from workers.run.wording import OWNED, Wording
from workers.rundir.album import AlbumEntry
from workers.rundir.lanes import Lane, parse_lane
from workers.rundir.records import (
    Crashed,
    Episode,
    Error,
    Eval,
    KnobRecord,
    KnobsApplied,
    KnobsRefused,
    Merge,
    MergeSkipped,
    Record,
    Resumed,
    SelfCheck,
    ShowcaseEpisode,
    Train,
)
from workers.rundir.requests import served_notice
from workers.rundir.settings import RunSettings
from workers.showcase.agent_view import frame_boxes as agent_view_boxes
from workers.showcase.episodes import LAYOUTS, nearest_entry, pane_boxes, source_album
from workers.showcase.frames import PaneInfo, pane_infos
from workers.showcase.replay import MODES
from workers.showcase.shown_weights import lane_source

__all__ = [
    # the run: Run.create / resume / attach give a BaseRun, laid out by its RunSettings
    "BaseRun",
    "Run",
    "RunSettings",
    "resumable",
    "ConnectedRun",
    "RunServer",
    "Link",
    "split_url",
    "token_from",
    "OWNED",
    "Wording",
    "served_notice",
    # what the window asks of a run, as data: run.do(command) -> Outcome
    "Command",
    "Outcome",
    "SetKnobs",
    "Pause",
    "Resume",
    "Checkpoint",
    "Stop",
    "AddWorker",
    "RemoveWorker",
    "RestartWorker",
    "StartRace",
    "Promote",
    "OpenShowcase",
    "ChooseShowcase",
    "ResetShowcase",
    "PauseRendering",
    "PinEpisode",
    "ShowPanes",
    # the album behind the timeline (file names only) and the viewport's panes
    "AlbumEntry",
    "LAYOUTS",
    "PaneInfo",
    "nearest_entry",
    "pane_boxes",
    "pane_infos",
    "agent_view_boxes",
    "source_album",
    "MakeMontage",
    # a run from the flags, the window's start-up or its new-run dialog, checked before made
    "NewRun",
    "RUNS",
    "check_run_flags",
    "config_from_args",
    "default_run_dir",
    "demo_requested",
    "new_run_from_dialog",
    "resume_from_args",
    "window_run_from_args",
    # the flags and presets (bench/cli.py builds its own command line from the same flags)
    "CPU_PLANNING",
    "CliParser",
    "MODES",
    "add_common_flags",
    "add_config_flags",
    "build_parser",
    "cuda_available",
    "demo_preset",
    "model_sizes",
    "tasks",
    # this machine: the window's threads, the number format
    "WINDOW_THREADS",
    "apply_threads",
    "check_threads",
    "describe_precision",
    # a race: lanes, the table that ranks them and its words, a lane's merged weights
    "MAX_LANES",
    "MIN_EPISODES",
    "RACE_TABLE_S",
    "SMOOTH",
    "Lane",
    "LaneRow",
    "RaceTable",
    "RaceTracker",
    "check_race",
    "lane_source",
    "level_text",
    "race_of",
    "race_top",
    "parse_lane",
    "reached_text",
    "row_cells",
    "sharing",
    "summary_lines",
    "t_975",
    # the records a run's events are made of
    "Crashed",
    "Episode",
    "Error",
    "Eval",
    "KnobRecord",
    "KnobsApplied",
    "KnobsRefused",
    "Merge",
    "MergeSkipped",
    "Record",
    "Resumed",
    "SelfCheck",
    "ShowcaseEpisode",
    "Train",
]
