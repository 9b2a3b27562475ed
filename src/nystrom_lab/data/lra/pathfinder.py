"""Pathfinder image generator following drewlinsley/pathfinder ``snakes2.py`` (LRA Pathfinder32 settings).

Legend: W window (32), a anti-alias scale (2), k cells of one paddle pattern.

Parameters (LRA ``lra_benchmarks/data/pathfinder.py`` docstring, on top of ``snakes2_wrapper.py``):
window 32, padding 1, paddle length 2, thickness 0.5, margin 1, marker radius 1.5, seed distance 7,
continuity 1.0, anti-alias scale 2, snake contrast 2, paddle contrast 0.75, distractor length
``contour_length // 3`` and ``20 // distractor_length`` distractor snakes, no single-paddle distractors
(``use_single_paddles = False``), paddle retrials 2, distractor-snake retrials 4.

Algorithm as in snakes2 (coordinates are integer pixels; ``translate`` rounds up like ``translate_coord``):

* Two target snakes start from seeds: seed 1's tail lies where a paddle fits in the mask whose border of
  ``2 * seed_distance`` is blocked (so near the centre); seed 2's tail is ``seed_distance`` away at a
  uniform integer angle. A paddle goes from its tail ``length`` pixels along its orientation (a uniform
  integer degree); its pivot sits ``margin`` behind the tail.
* Each extension steps the pivot ``length + 2 margin`` ahead and samples the next head on the circle of
  radius ``length + margin`` around it, with weight ``cos(min(|turn| * continuity, pi/2))**2`` times
  ``1 - dilated occupancy``; the paddle is drawn from the head back towards the pivot and accepted unless
  its dilated mask overlaps the occupancy (both >= 0.9 somewhere; snakes2 tests ``mask + m < 1.8``), with
  ``max_paddle_retrial + 1`` tries. A segment's mask enters the occupancy one step later, so consecutive
  paddles may touch. Both targets grow alternately; any failure restarts the pair.
* Distractor snakes of ``distractor_length`` paddles are seeded anywhere a paddle fits (border
  ``padding``), grown the same way, dropped whole on failure, tried ``retrials + 1`` times each.
* Markers: discs of radius ``marker_radius`` at one target's tail and at the head of the last paddle of
  the same target (label 1) or of the other one (label 0). Intensities: targets ``0.75 * 2``,
  distractors ``2``, markers ``1``; the image is rescaled so its maximum is 255 (``scipy.misc.imsave``).

Deviations, all documented here: drawing is done on an ``a``-times grid with a ``round(thickness * a)``
pixel line and reduced by block averaging instead of PIL + Lanczos (so intensities are multiples of
``1 / a**2``); occupancy thresholds are read on those block averages; the last paddle of *both* targets
enters the occupancy before distractors are drawn (snakes2 forgets the first snake's); labels are drawn by
the caller so that every file is balanced (snakes2 draws ``randint(0, 2)`` per image).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


@dataclass(frozen=True)
class PathfinderConfig:
    """snakes2 arguments with the LRA Pathfinder32 values; ``contour_length`` 6, 9 or 14."""

    contour_length: int = 14
    window: int = 32
    padding: int = 1
    paddle_length: int = 2
    paddle_thickness: float = 0.5
    margin: int = 1
    marker_radius: float = 1.5
    seed_distance: int = 7
    continuity: float = 1.0
    antialias_scale: int = 2
    snake_contrast: float = 2.0
    paddle_contrast: float = 0.75
    marker_contrast: float = 1.0
    max_paddle_retrial: int = 2
    max_distractor_retrial: int = 4
    distractor_length: int = field(init=False)
    num_distractor_snakes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.contour_length < 3:
            raise ValueError(f"contour_length must be >= 3, got {self.contour_length}")
        if (self.paddle_thickness * self.antialias_scale) % 1 != 0:
            raise ValueError("paddle_thickness * antialias_scale must be a whole number of pixels")
        object.__setattr__(self, "distractor_length", self.contour_length // 3)
        object.__setattr__(self, "num_distractor_snakes", 20 // self.distractor_length)


@dataclass(frozen=True)
class _Pattern:
    """A paddle of one orientation relative to its start cell: drawn line and dilated mask."""

    line_offsets: np.ndarray  # (k,) flat offsets on the padded grid
    line_vals: np.ndarray  # (k,) coverage in (0, 1]
    mask_offsets: np.ndarray  # (k2,)
    mask_vals: np.ndarray  # (k2,)
    struct_cells: np.ndarray  # (k3, 2): fully covered mask cells, snakes2's dilation struct


def _coverage(hi_px: np.ndarray, a: int) -> tuple[np.ndarray, np.ndarray]:
    cells, counts = np.unique(np.floor_divide(hi_px, a), axis=0, return_counts=True)
    return cells.astype(np.int64), counts / float(a * a)


@lru_cache(maxsize=8192)
def _pattern(theta: float, cfg: PathfinderConfig) -> _Pattern:
    """Cell offsets of a paddle along ``theta``: drawn on the a-grid, dilated by ``margin``, block-averaged."""
    length, thickness, margin, a = cfg.paddle_length, cfg.paddle_thickness, cfg.margin, cfg.antialias_scale
    direction = np.array([math.sin(theta), math.cos(theta)])
    t = np.linspace(0.0, length * a, 4 * length * a + 1)[:, None]  # (s, 1)
    width = round(thickness * a)
    normal = np.array([direction[1], -direction[0]])
    shifts = (np.arange(width) - (width - 1) / 2.0)[:, None, None] * normal  # (w, 1, 2)
    pts = (t * direction)[None] + shifts  # (w, s, 2)
    hi = np.unique(np.floor(pts.reshape(-1, 2) + 0.5).astype(np.int64), axis=0)  # line pixels on the a-grid
    r = margin * a
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    disc = np.stack([dy[dy**2 + dx**2 <= r * r], dx[dy**2 + dx**2 <= r * r]], axis=1)  # (q, 2)
    dil = np.unique((hi[:, None, :] + disc[None]).reshape(-1, 2), axis=0)
    line_cells, line_vals = _coverage(hi, a)
    mask_cells, mask_vals = _coverage(dil, a)
    g = _grid(cfg)[0]
    return _Pattern(
        line_cells @ (g, 1), line_vals, mask_cells @ (g, 1), mask_vals, mask_cells[mask_vals >= 1.0]
    )


Stroke = tuple[np.ndarray, np.ndarray]  # (flat indices (k,) on the padded grid, values (k,)), indices unique


@lru_cache(maxsize=16)
def _grid(cfg: PathfinderConfig) -> tuple[int, int, np.ndarray]:
    """``(G, P, inside)``: canvases are flat (G*G,) with a margin of P cells around the W x W window.

    The margin lets every neighbourhood read happen without bounds checks; nothing is ever written
    outside the window (strokes are clipped with ``inside``, (G*G,) bool), so those cells stay 0, which is
    what cv2.dilate's border and snakes2's clipping amount to.
    """
    p = cfg.paddle_length + 2 * cfg.margin + 4
    g = cfg.window + 2 * p
    inside = np.zeros((g, g), dtype=bool)
    inside[p : p + cfg.window, p : p + cfg.window] = True
    return g, p, inside.reshape(-1)


def stamp(target: np.ndarray, stroke: Stroke, scale: float = 1.0) -> None:
    """Max-composite ``stroke`` (times ``scale``) into the flat (G*G,) array ``target`` in place."""
    idx, vals = stroke
    target[idx] = np.maximum(target[idx], vals * scale)


@lru_cache(maxsize=16)
def _circle(cfg: PathfinderConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """snakes2 ``get_coords_cmf`` candidates around a pivot: ``(offsets (q, 2), flat (q,), angles (q,),
    flat offsets of each candidate's dilation disc (q, r))``.

    snakes2 samples one point per pixel of arc and truncates ``pivot + offset`` with ``astype(int)``; for an
    integer pivot and a point inside the image that equals ``pivot + floor(offset)``.
    """
    radius, g = cfg.paddle_length + cfg.margin, _grid(cfg)[0]
    angles = np.arange(0.0, 360.0, 360.0 / (2 * radius * math.pi)) * math.pi / 180
    offs = np.floor(np.stack([radius * np.sin(angles), radius * np.cos(angles)], axis=1)).astype(np.int64)
    offs = np.unique(offs, axis=0)  # sorted by (y, x) like np.unique(coords, axis=0)
    r = cfg.margin
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    disc = (dy * g + dx)[dy**2 + dx**2 <= r * r]  # snakes2 generate_dilation_struct(margin)
    flat = offs @ (g, 1)
    return offs, flat, np.arctan2(offs[:, 0], offs[:, 1]), flat[:, None] + disc[None]


def translate(p: tuple[int, int], theta: float, dist: float) -> tuple[int, int]:
    """snakes2 ``translate_coord``: move ``dist`` along ``theta`` and round both coordinates up."""
    return math.ceil(p[0] + dist * math.sin(theta)), math.ceil(p[1] + dist * math.cos(theta))


def flip(theta: float) -> float:
    return theta + math.pi if theta < 0 else theta - math.pi


class _Canvas:
    """Image and occupancy mask of one sample, each a flat (G*G,) float array (see :func:`_grid`)."""

    def __init__(self, cfg: PathfinderConfig, rng: np.random.Generator) -> None:
        self.cfg, self.rng = cfg, rng
        self.g, self.p, self.in_window = _grid(cfg)
        self.image = np.zeros(self.g * self.g)
        self.mask = np.zeros(self.g * self.g)
        w, q = cfg.window, cfg.padding
        win = self.window(self.mask)
        win[:q, :], win[w - q :, :], win[:, :q], win[:, w - q :] = 1, 1, 1, 1

    def window(self, flat: np.ndarray) -> np.ndarray:
        """The (W, W) view of a flat canvas."""
        w, p = self.cfg.window, self.p
        return flat.reshape(self.g, self.g)[p : p + w, p : p + w]

    def flat(self, yx: tuple[int, int]) -> int:
        return (yx[0] + self.p) * self.g + yx[1] + self.p

    def inside(self, yx: tuple[int, int]) -> bool:
        return 0 <= yx[0] < self.cfg.window and 0 <= yx[1] < self.cfg.window

    def paddle(self, start: tuple[int, int], theta: float) -> tuple[Stroke, Stroke]:
        """Drawn line and dilated mask of a paddle from ``start`` (inside the window) along ``theta``."""
        pat, s = _pattern(theta, self.cfg), self.flat(start)
        line, seg = s + pat.line_offsets, s + pat.mask_offsets
        keep_l, keep_s = self.in_window[line], self.in_window[seg]
        return (line[keep_l], pat.line_vals[keep_l]), (seg[keep_s], pat.mask_vals[keep_s])

    def seed(self, border: int, stop_with_availability: float | None) -> tuple | None:
        """snakes2 ``seed_snake``: ``(tail, pivot, theta, line, seg_mask)`` or None on failure."""
        c, w = self.cfg, self.cfg.window
        occupied = self.window(self.mask) > 0.3  # (W, W)
        if stop_with_availability is not None and 1 - occupied.mean() < stop_with_availability:
            return None
        occupied[:border, :], occupied[w - border :, :] = True, True
        occupied[:, :border], occupied[:, w - border :] = True, True
        for _ in range(c.max_paddle_retrial + 1):
            theta = int(self.rng.integers(-180, 180)) * math.pi / 180
            unavailable = np.zeros((w, w), dtype=bool)
            for dy, dx in _pattern(theta, c).struct_cells:  # p is blocked if occupied[p + offset]
                unavailable[max(0, -dy) : w - max(0, dy), max(0, -dx) : w - max(0, dx)] |= occupied[
                    max(0, dy) : w - max(0, -dy), max(0, dx) : w - max(0, -dx)
                ]
            free = np.flatnonzero(~unavailable)
            if free.size == 0:
                return None
            tail = divmod(int(free[self.rng.integers(free.size)]), w)
            head = translate(tail, theta, c.paddle_length)
            pivot = translate(head, flip(theta), c.paddle_length + c.margin)
            if self.inside(head) and self.inside(pivot):
                line, seg = self.paddle(tail, theta)
                return tail, pivot, theta, line, seg
        return None

    def extend(self, pivot: tuple[int, int], theta: float) -> tuple | None:
        """snakes2 ``extend_snake``: ``(new_pivot, new_theta, head, line, seg_mask)`` or None."""
        c, w = self.cfg, self.cfg.window
        new_pivot = translate(pivot, theta, c.paddle_length + 2 * c.margin)
        radius = c.paddle_length + c.margin
        if not (-radius <= new_pivot[0] < w + radius and -radius <= new_pivot[1] < w + radius):
            return None  # every candidate would be outside the image
        offs, flat_offs, angles, disc_offs = _circle(c)
        base = self.flat(new_pivot)
        ok = self.in_window[base + flat_offs]  # (q,)
        if not ok.any():
            return None
        orient = angles[ok]
        dilated = self.mask[base + disc_offs[ok]].max(axis=1)  # (q,): grey dilation read where needed
        turn = np.abs(orient - theta)
        turn = np.minimum(np.minimum(turn, 2 * math.pi - turn) * c.continuity, 0.5 * math.pi)
        pmf = (1 - dilated) * np.maximum(np.cos(turn), 0) ** 2
        total = pmf.sum()
        if total < 1e-4:
            return None
        cmf = np.cumsum(pmf / total)
        cand = offs[ok]
        for _ in range(c.max_paddle_retrial + 1):
            idx = int(np.argmax(cmf - self.rng.random() > 0))
            head = (new_pivot[0] + int(cand[idx, 0]), new_pivot[1] + int(cand[idx, 1]))
            line, seg = self.paddle(head, flip(float(orient[idx])))
            if (self.mask[seg[0]] + seg[1]).max() < 1.8:
                return new_pivot, float(orient[idx]), head, line, seg
        return None
