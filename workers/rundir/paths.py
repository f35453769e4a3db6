"""Where things are in a run directory: the file names several modules share, spelled once here;
a file that one module alone reads and writes keeps its name there (named below with it).

run.json              the run's settings (settings.py)
config.json           the config (directory.py)
knobs.json(l)         the live knobs and their history (knob_record.py)
requests.jsonl        what attached windows asked of the owner (requests.py)
worker-K.jsonl        worker K's metrics records; player.jsonl the showcase's
worker-K.pt           worker K's networks and optimisers when it stopped (RunDir.weights_path)
checkpoints/worker-K.pt
merge/worker-K.pt     worker K's last merge contribution; merge/merged.pt the mean
merge/members.json    who merges now (workers/merging/files.py)
merge/lane-L/         lane L's merge pool in a race: its workers' files and its merged.pt
start.pt              the weights a new run starts from (--load; workers/cli/new_run.py)
replays/worker-K.npz  worker K's newest episode as poses, for the viewport's replay
                      (-eval: its newest evaluation's last episode; replays.py)
album/worker-K/       worker K's episodes kept across the whole run, for the timeline (album.py)
tb/, eval*.csv        TensorBoard's event files, the evaluations as CSV (sinks.py)
rank-R/               a torchrun job's rank R's own files, on its machine (rank_records.py)
media/                the window's screenshots and clips (viewer/recorder.py), montages
                      (workers/showcase/montage.py)
"""

from __future__ import annotations

from pathlib import Path

RUN = "run.json"
CONFIG = "config.json"
METRICS = "metrics.jsonl"  # a lone agent's records (RunDir's default)
WEIGHTS = "weights.pt"  # a lone agent's weights (RunDir's default)
MERGE_DIR = "merge"
MERGED = "merged.pt"
OUTER = "outer.pt"  # a pool's outer-step state (workers/merging/outer.py)
MEMBERS = "members.json"
CHECKPOINTS = "checkpoints"
PLAYER_LOG = "player.jsonl"
START = "start.pt"
REPLAYS = "replays"
ALBUM = "album"
MEDIA = "media"  # screenshots, clips and montages: the window's and `launch.py montage`'s


def metrics_name(index: int | str) -> str:
    """Worker `index`'s metrics file, relative to the run directory ("*": a glob of all)."""
    return f"worker-{index}.jsonl"


def weights_name(index: int) -> str:
    """The file name of worker `index`'s weights (its checkpoint, its merge contribution)."""
    return f"worker-{index}.pt"


def checkpoint_path(run_path: str | Path, index: int) -> Path:
    return Path(run_path) / CHECKPOINTS / weights_name(index)


def merge_dir(run_path: str | Path) -> Path:
    return Path(run_path) / MERGE_DIR


def pool_dir(run_path: str | Path, lane: int | None = None) -> Path:
    """The merge files of one pool: the run's (no race, `lane` None) or lane `lane`'s."""
    return merge_dir(run_path) if lane is None else merge_dir(run_path) / f"lane-{lane}"


def merged_path(run_path: str | Path, lane: int | None = None) -> Path:
    """The newest merged weights of the run's pool, or of lane `lane`'s in a race (every
    merge writes it again)."""
    return pool_dir(run_path, lane) / MERGED


def promoted_path(run_path: str | Path, pool: int) -> Path:
    """The promoted lane's weights at the promotion that formed pool `pool` (its version)."""
    return merge_dir(run_path) / f"promoted-{pool}.pt"


def members_path(run_path: str | Path) -> Path:
    return merge_dir(run_path) / MEMBERS


def start_path(run_path: str | Path) -> Path:
    """The weights every worker starts from instead of fresh ones (a run started with --load)."""
    return Path(run_path) / START
