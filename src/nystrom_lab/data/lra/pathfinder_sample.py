"""One Pathfinder sample: two target snakes, distractor snakes, two markers (snakes2 ``from_wrapper``).

Legend: W window (32), a anti-alias scale. See :mod:`nystrom_lab.data.lra.pathfinder` for the rules.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from nystrom_lab.data.lra.pathfinder import PathfinderConfig, _Canvas, _coverage, flip, stamp, translate

_MAX_PAIR_ATTEMPTS = 1000


def _two_snakes(cv: _Canvas) -> tuple[list[np.ndarray], list, list] | None:
    """snakes2 ``two_snakes``: ``(per-snake images [(G*G,)] * 2, origin tips, terminal tips)`` or None."""
    c = cv.cfg
    first = cv.seed(border=2 * c.seed_distance, stop_with_availability=None)
    if first is None:
        return None
    tail1, pivot1, theta1, line1, seg1 = first
    for _ in range(c.max_paddle_retrial + 1):
        theta2 = int(cv.rng.integers(-180, 180)) * math.pi / 180
        phi = int(cv.rng.integers(0, 360)) * math.pi / 180
        tail2 = (
            int(np.round(tail1[0] + c.seed_distance * math.sin(phi))),
            int(np.round(tail1[1] + c.seed_distance * math.cos(phi))),
        )
        head2 = translate(tail2, theta2, c.paddle_length)
        pivot2 = translate(head2, flip(theta2), c.paddle_length + c.margin)
        if cv.inside(head2) and cv.inside(pivot2):
            break
    else:
        return None
    line2, seg2 = cv.paddle(tail2, theta2)
    contrast = c.paddle_contrast * c.snake_contrast
    images = [np.zeros_like(cv.image), np.zeros_like(cv.image)]
    stamp(images[0], line1, contrast)
    stamp(images[1], line2, contrast)
    segs, pivots, thetas = [seg1, seg2], [pivot1, pivot2], [theta1, theta2]
    heads: list = [None, None]
    for _ in range(c.contour_length - 1):
        for s in (0, 1):
            step = cv.extend(pivots[s], thetas[s])
            if step is None:
                return None
            pivots[s], thetas[s], heads[s], line, seg = step
            stamp(images[s], line, contrast)
            stamp(cv.mask, segs[s])  # the previous paddle now blocks
            segs[s] = seg
    for seg in segs:
        stamp(cv.mask, seg)
    return images, [tail1, tail2], heads


def _snake(cv: _Canvas, n_paddles: int, contrast: float) -> bool:
    """snakes2 ``make_snake`` for a distractor: draw it whole into ``cv`` or leave ``cv`` unchanged."""
    saved_mask = cv.mask.copy()
    first = cv.seed(border=1, stop_with_availability=0.01)
    if first is None:
        return False
    _, pivot, theta, line, seg = first
    image = np.zeros_like(cv.image)
    stamp(image, line)
    for _ in range(n_paddles - 1):
        step = cv.extend(pivot, theta)
        if step is None:
            cv.mask = saved_mask
            return False
        pivot, theta, _, line, new_seg = step
        stamp(image, line)
        stamp(cv.mask, seg)
        seg = new_seg
    stamp(cv.mask, seg)
    np.maximum(cv.image, image * contrast, out=cv.image)
    return True


@lru_cache(maxsize=16)
def _disc_pattern(radius: float, a: int) -> tuple[np.ndarray, np.ndarray]:
    r = math.ceil(radius * a)
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    inside = dy**2 + dx**2 <= (radius * a) ** 2
    return _coverage(np.stack([dy[inside], dx[inside]], axis=1), a)


def sample_pathfinder(cfg: PathfinderConfig, rng: np.random.Generator, label: int) -> np.ndarray:
    """One image (W, W) uint8 whose markers are on the same target snake iff ``label == 1``."""
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    for _ in range(_MAX_PAIR_ATTEMPTS):
        cv = _Canvas(cfg, rng)
        pair = _two_snakes(cv)
        if pair is not None:
            break
    else:
        raise RuntimeError(f"no pair of target snakes fits after {_MAX_PAIR_ATTEMPTS} attempts with {cfg}")
    targets, origins, terminals = pair
    cv.image = np.maximum(targets[0], targets[1])
    for _ in range(cfg.num_distractor_snakes):
        for _ in range(cfg.max_distractor_retrial + 1):
            if _snake(cv, cfg.distractor_length, cfg.snake_contrast):
                break
    origin = int(rng.integers(0, 2))
    terminal = origin if label == 1 else 1 - origin
    cells, vals = _disc_pattern(cfg.marker_radius, cfg.antialias_scale)
    for p in (origins[origin], terminals[terminal]):
        idx = cv.flat(p) + cells @ (cv.g, 1)
        keep = cv.in_window[idx]
        stamp(cv.image, (idx[keep], vals[keep]), cfg.marker_contrast)
    image = cv.window(cv.image)
    return np.floor(image * (255.0 / image.max()) + 0.5).astype(
        np.uint8
    )  # scipy.misc.imsave's bytescale  # scipy.misc.imsave's bytescale
