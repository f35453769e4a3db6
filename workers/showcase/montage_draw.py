"""What a montage draws over the rendered episodes (Pillow): the episode's step and return as
text, and in a corner the worker's learning curve with a marker at that step; then the tiles of
a race side by side in one frame."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

# The window's font (assets/), else Pillow's own: an installed package has no assets folder.
FONT = Path(__file__).resolve().parents[2] / "assets" / "fonts" / "DejaVuSans.ttf"
TEXT = (240, 240, 240, 255)
SHADOW = (0, 0, 0, 255)
PANEL = (16, 18, 22, 190)  # the chart's backing, see-through
CURVE = (110, 170, 255, 255)
MARKER = (255, 170, 60, 255)
MUTED = (170, 170, 170, 255)


def font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The text font at `size` pixels."""
    try:
        return ImageFont.truetype(str(FONT), size)
    except OSError:
        return ImageFont.load_default(size)


def number(value: float) -> str:
    """A return as the chart labels it: whole above 100, else to 3 significant digits."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def grid(tiles: int) -> tuple[int, int]:
    """(rows, columns) for this many tiles: one row up to three, then as square as it goes."""
    cols = tiles if tiles <= 3 else math.ceil(math.sqrt(tiles))
    return math.ceil(tiles / cols), cols


Curve = tuple[tuple[int, float], ...]  # (agent step, return) points


def chart_scale(curves: list[Curve]) -> tuple[float, float, int]:
    """(lowest return, highest, last step) over these curves: a race's charts share them, so
    that the lanes' curves compare at a glance."""
    returns = [r for curve in curves for _, r in curve] or [0.0]
    low, high = min(returns), max(returns)
    last = max([s for curve in curves for s, _ in curve] or [1])
    return low, (high if high > low else low + 1.0), max(last, 1)


def tile_overlay(
    size: tuple[int, int],
    lines: list[str],
    curve: Curve,
    marker: tuple[int, float],
    scale: tuple[float, float, int],
) -> Image.Image:
    """A see-through RGBA layer of a tile of `size` (height, width): `lines` of text at the
    top left, and the learning curve with `marker` (step, return) at the bottom right, drawn to
    `scale` (chart_scale). It is the same for every frame of an episode: drawn once each."""
    height, width = size
    layer = Image.new("RGBA", (width, height), (0, 0, 0, 0))
    draw = ImageDraw.Draw(layer)
    text_px = max(9, height // 22)
    face, outline = font(text_px), max(1, text_px // 9)
    y = text_px // 3
    for line in lines:
        at = (text_px // 2, y)
        draw.text(at, line, font=face, fill=TEXT, stroke_width=outline, stroke_fill=SHADOW)
        y += int(text_px * 1.25)
    box_w, box_h = int(width * 0.42), int(height * 0.3)
    left, top = width - box_w - text_px // 2, height - box_h - text_px // 2
    _chart(draw, (left, top, left + box_w, top + box_h), curve, marker, scale)
    return layer


def _chart(draw: ImageDraw.ImageDraw, box: tuple[int, int, int, int], curve, marker, scale):
    left, top, right, bottom = box
    px = max(8, (bottom - top) // 9)  # the labels' size
    draw.rounded_rectangle(box, radius=px // 2, fill=PANEL)
    face = font(px)
    low, high, last = scale
    pad = px // 2
    # The plot area leaves room for the axis labels: the highest return above, steps below.
    x0, x1, y0, y1 = left + pad, right - pad, top + pad + px, bottom - pad - px

    def at(step: float, ret: float) -> tuple[float, float]:
        return x0 + (x1 - x0) * step / last, y1 - (y1 - y0) * (ret - low) / (high - low)

    draw.text((x0, top + pad // 2), f"return  {number(high)}", font=face, fill=MUTED)
    draw.text((x0, y1 + pad // 2), number(low), font=face, fill=MUTED)
    draw.text((x1, y1 + pad // 2), f"step {last:,}", font=face, fill=MUTED, anchor="ra")
    if len(curve) > 1:
        draw.line([at(s, r) for s, r in curve], fill=CURVE, width=max(1, px // 8))
    x, y = at(*marker)
    draw.line([(x, y0), (x, y1)], fill=MARKER, width=max(1, px // 8))
    dot = max(2, px // 3)
    draw.ellipse((x - dot, y - dot, x + dot, y + dot), fill=MARKER)


def compose(frames: list[np.ndarray], layers: list[Image.Image], rows_cols: tuple[int, int]):
    """One video frame (uint8 RGB): each rendered tile with its layer on top, in a grid (empty
    places stay black)."""
    rows, cols = rows_cols
    height, width = frames[0].shape[:2]
    out = Image.new("RGB", (width * cols, height * rows))
    for n, (frame, layer) in enumerate(zip(frames, layers)):
        tile = Image.fromarray(frame).convert("RGBA")
        tile.alpha_composite(layer)
        out.paste(tile.convert("RGB"), ((n % cols) * width, (n // cols) * height))
    return np.asarray(out)
