"""Rasterisers for the driving observations: an ego-centred BEV grid and a pinhole front camera.

Both draw the same scene description with OpenCV polygon fills (no pygame, no window): lane surfaces
and markings cached from the road network once per episode, vehicles as oriented boxes.

BEV (``bev``): (C, H, W) uint8, values 0 or 255, ego-centred and ego-aligned: image up = ego forward
(+x), image left = ego left (+y); ``m_per_px`` metres per pixel; the ego's centre sits at column W/2 and
at row ``ego_row`` (so more is seen ahead than behind). Channels (``BEV_CHANNELS``):
    0 drivable   lane surfaces
    1 markings   lane boundary lines (continuous and striped)
    2 vehicles   other vehicles' footprints
    3 static     static obstacles' footprints
    4 ego        the ego's footprint
    5 route      the route target points joined as a polyline

Front camera (``image``): (H, W, 3) uint8 RGB, a perspective projection (OpenCV pinhole: x right, y
down, z forward) from a camera 1.5 m above the ground at the front of the ego (``x = +1.0 m``), pitched
down 3 degrees, horizontal field of view ``hfov_deg``. It draws sky, ground, lane surfaces, lane
markings and vehicles as flat-shaded 3-D boxes (1.5 m tall; obstacles 1.0 m), far to near (painter's
algorithm). It is a schematic camera: no textures, lighting or lens effects.
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np

from sim.driving.geometry import hw_to_ego

BEV_CHANNELS: tuple[str, ...] = ("drivable", "markings", "vehicles", "static", "ego", "route")

_SKY = (150, 190, 235)
_GROUND = (96, 124, 84)
_ROAD = (88, 88, 92)
_MARK = (235, 235, 235)
_VEHICLE = np.array([60, 100, 210], dtype=np.float64)
_STATIC = np.array([200, 70, 40], dtype=np.float64)
_SHIFT = 3  # fixed-point bits for sub-pixel polygon vertices
_STRIPE_ON, _STRIPE_PERIOD = 3.0, 9.0  # dashed markings: 3 m painted every 9 m


def _lane_samples(lane: Any) -> np.ndarray:
    """Longitudinal samples along a lane: coarse on straight lanes, 1.5 m on curved ones."""
    step = 20.0 if type(lane).__name__ == "StraightLane" else 1.5
    n = max(int(np.ceil(lane.length / step)), 1)
    return np.linspace(0.0, lane.length, n + 1)


class SceneRasterizer:
    """Caches a road network's geometry and rasterises the BEV grid and the front-camera image.

    Args:
        network: highway-env ``RoadNetwork`` (read once, at construction).
        bev_size: (H, W) of the BEV grid [px].
        bev_m_per_px: BEV resolution [m / px].
        bev_ego_row: Row of the ego's centre in the BEV (default: three quarters down).
        image_size: (H, W) of the camera image [px].
        hfov_deg: Horizontal field of view of the camera [deg].
        far_m: Nothing farther than this from the ego is drawn in the camera [m].
    """

    CAM_X, CAM_Z, CAM_PITCH = 1.0, 1.5, np.deg2rad(3.0)
    NEAR = 0.3

    def __init__(
        self,
        network: Any,
        bev_size: tuple[int, int] = (64, 64),
        bev_m_per_px: float = 1.0,
        bev_ego_row: int | None = None,
        image_size: tuple[int, int] = (96, 192),
        hfov_deg: float = 90.0,
        far_m: float = 150.0,
    ):
        self.bev_size = tuple(int(v) for v in bev_size)
        self.m_per_px = float(bev_m_per_px)
        self.ego_row = int(bev_ego_row if bev_ego_row is not None else round(0.75 * self.bev_size[0]))
        self.image_size = tuple(int(v) for v in image_size)
        self.far = float(far_m)
        h, w = self.image_size
        self.fx = (w / 2) / np.tan(np.deg2rad(hfov_deg) / 2)
        self.cx, self.cy = w / 2, h / 2

        quads, marks = [], []
        for to_dict in network.graph.values():
            for lanes in to_dict.values():
                for lane in lanes:
                    s = _lane_samples(lane)
                    half = np.array([lane.width_at(float(x)) / 2 for x in s])
                    left = np.array([lane.position(float(x), -hw) for x, hw in zip(s, half)])
                    right = np.array([lane.position(float(x), hw) for x, hw in zip(s, half)])
                    quads.append(np.stack([left[:-1], left[1:], right[1:], right[:-1]], axis=1))
                    for side, lateral_sign in ((0, -1.0), (1, 1.0)):
                        kind = lane.line_types[side] if lane.line_types else 0
                        if kind == 0:  # LineType.NONE
                            continue
                        if kind == 1:  # LineType.STRIPED: short dashes
                            starts = np.arange(0.0, lane.length, _STRIPE_PERIOD)
                            seg_s = np.stack([starts, np.minimum(starts + _STRIPE_ON, lane.length)], axis=1)
                        else:
                            seg_s = np.stack([s[:-1], s[1:]], axis=1)
                        pts = np.array(
                            [
                                [
                                    lane.position(float(a), lateral_sign * lane.width_at(float(a)) / 2)
                                    for a in pair
                                ]
                                for pair in seg_s
                            ]
                        )
                        marks.append(pts.reshape(-1, 2, 2))
        self._quads = np.concatenate(quads).astype(np.float64) if quads else np.zeros((0, 4, 2))
        self._marks = np.concatenate(marks).astype(np.float64) if marks else np.zeros((0, 2, 2))

    # ---------------------------------------------------------------- BEV
    def _bev_px(self, pts_ego: np.ndarray) -> np.ndarray:
        """Ego-frame points (..., 2) [m] -> fixed-point BEV pixel coordinates (..., 2) int32 (col, row)."""
        col = self.bev_size[1] / 2 - pts_ego[..., 1] / self.m_per_px
        row = self.ego_row - pts_ego[..., 0] / self.m_per_px
        return np.round(np.stack([col, row], axis=-1) * (1 << _SHIFT)).astype(np.int32)

    def _in_bev(self, pts_ego: np.ndarray) -> np.ndarray:
        """Mask over the leading axis: any point of the item within the BEV (plus a margin)."""
        h, w = self.bev_size
        m = self.m_per_px
        x, y = pts_ego[..., 0], pts_ego[..., 1]
        inside = (
            (x < (self.ego_row + 2) * m) & (x > -(h - self.ego_row + 2) * m) & (np.abs(y) < (w / 2 + 2) * m)
        )
        return inside.reshape(inside.shape[0], -1).any(axis=1)

    def bev(
        self,
        ego_pos_hw: np.ndarray,
        ego_heading_hw: float,
        boxes: np.ndarray,
        static: np.ndarray,
        route_ego: np.ndarray,
        ego_size: tuple[float, float] = (5.0, 2.0),
    ) -> np.ndarray:
        """Rasterise the BEV grid.

        Args:
            ego_pos_hw: (2,) ego position, highway-env frame [m].
            ego_heading_hw: Ego heading, highway-env frame [rad].
            boxes: (N, 5) other objects as (x_hw, y_hw, heading_hw, length, width) [m, rad].
            static: (N,) bool, True for static obstacles.
            route_ego: (K, 2) route points in the ego frame [m].
            ego_size: Ego (length, width) [m].

        Returns:
            (6, H, W) uint8 grid, 0 / 255 per channel (see ``BEV_CHANNELS``).
        """
        h, w = self.bev_size
        grid = np.zeros((len(BEV_CHANNELS), h, w), dtype=np.uint8)
        quads = hw_to_ego(self._quads, ego_pos_hw, ego_heading_hw)
        quads = quads[self._in_bev(quads)]
        if len(quads):
            cv2.fillPoly(grid[0], list(self._bev_px(quads)), 255, lineType=cv2.LINE_8, shift=_SHIFT)
        marks = hw_to_ego(self._marks, ego_pos_hw, ego_heading_hw)
        marks = marks[self._in_bev(marks)]
        if len(marks):
            cv2.polylines(grid[1], list(self._bev_px(marks)), False, 255, 1, cv2.LINE_8, _SHIFT)
        if len(boxes):
            corners = hw_to_ego(_box_corners(boxes), ego_pos_hw, ego_heading_hw)
            keep = self._in_bev(corners)
            for channel, mask in ((2, ~static), (3, static)):
                sel = corners[keep & mask]
                if len(sel):
                    cv2.fillPoly(grid[channel], list(self._bev_px(sel)), 255, cv2.LINE_8, _SHIFT)
        length, width = ego_size
        ego = np.array(
            [
                [length / 2, width / 2],
                [length / 2, -width / 2],
                [-length / 2, -width / 2],
                [-length / 2, width / 2],
            ]
        )
        cv2.fillPoly(grid[4], [self._bev_px(ego)], 255, cv2.LINE_8, _SHIFT)
        if len(route_ego) >= 2:
            cv2.polylines(grid[5], [self._bev_px(np.asarray(route_ego))], False, 255, 1, cv2.LINE_8, _SHIFT)
        return grid

    # ------------------------------------------------------------- camera
    def _to_cam(self, pts_ego: np.ndarray, z: np.ndarray | float) -> np.ndarray:
        """Ego-frame ground points (..., 2) at heights z [m] -> OpenCV camera coordinates (..., 3) [m]."""
        x = -pts_ego[..., 1]
        y = self.CAM_Z - np.broadcast_to(z, pts_ego.shape[:-1])
        zf = pts_ego[..., 0] - self.CAM_X
        c, s = np.cos(self.CAM_PITCH), np.sin(self.CAM_PITCH)
        return np.stack([x, y * c - zf * s, y * s + zf * c], axis=-1)

    def _project(self, cam: np.ndarray) -> np.ndarray:
        """Camera points (..., 3) with z >= NEAR -> fixed-point pixel coordinates (..., 2) int32."""
        z = np.maximum(cam[..., 2], 1e-6)
        u = self.fx * cam[..., 0] / z + self.cx
        v = self.fx * cam[..., 1] / z + self.cy
        lim = 1e5  # keep fixed-point coordinates far from int32 overflow
        uv = np.clip(np.stack([u, v], axis=-1), -lim, lim)
        return np.round(uv * (1 << _SHIFT)).astype(np.int32)

    def _visible_polys(self, cam_polys: np.ndarray) -> list[np.ndarray]:
        """Clip (N, V, 3) camera-frame polygons to z >= NEAR and project them (drops empty ones)."""
        z = cam_polys[..., 2]
        front = (z >= self.NEAR).all(axis=1)
        out = list(self._project(cam_polys[front]))
        for poly in cam_polys[(z >= self.NEAR).any(axis=1) & ~front]:
            clipped = _clip_near(poly, self.NEAR)
            if len(clipped) >= 3:
                out.append(self._project(clipped))
        return out

    def camera(
        self, ego_pos_hw: np.ndarray, ego_heading_hw: float, boxes: np.ndarray, static: np.ndarray
    ) -> np.ndarray:
        """Render the front camera.

        Args:
            ego_pos_hw: (2,) ego position, highway-env frame [m].
            ego_heading_hw: Ego heading, highway-env frame [rad].
            boxes: (N, 5) other objects as (x_hw, y_hw, heading_hw, length, width) [m, rad].
            static: (N,) bool, True for static obstacles.

        Returns:
            (H, W, 3) uint8 RGB image, row 0 at the top.
        """
        h, w = self.image_size
        img = np.empty((h, w, 3), dtype=np.uint8)
        img[:] = _SKY
        ground = np.array(
            [[[self.NEAR + self.CAM_X, 1e4], [1e4, 1e4], [1e4, -1e4], [self.NEAR + self.CAM_X, -1e4]]]
        )
        cv2.fillPoly(img, self._visible_polys(self._to_cam(ground, 0.0)), _GROUND, cv2.LINE_8, _SHIFT)

        def near_enough(pts: np.ndarray) -> np.ndarray:
            d = pts.reshape(pts.shape[0], -1, 2)
            return ((d[..., 0] > self.CAM_X) & (np.linalg.norm(d, axis=-1) < self.far)).any(axis=1)

        quads = hw_to_ego(self._quads, ego_pos_hw, ego_heading_hw)
        quads = quads[near_enough(quads)]
        if len(quads):
            cv2.fillPoly(img, self._visible_polys(self._to_cam(quads, 0.0)), _ROAD, cv2.LINE_8, _SHIFT)
        marks = hw_to_ego(self._marks, ego_pos_hw, ego_heading_hw)
        marks = marks[near_enough(marks)]
        if len(marks):
            segs = self._to_cam(marks, 0.02)
            lines = [p for p in (_clip_segment(seg, self.NEAR) for seg in segs) if p is not None]
            if lines:
                cv2.polylines(img, [self._project(p) for p in lines], False, _MARK, 1, cv2.LINE_AA, _SHIFT)

        if len(boxes):
            corners = hw_to_ego(_box_corners(boxes), ego_pos_hw, ego_heading_hw)  # (N, 4, 2)
            keep = near_enough(corners)
            centres = corners.mean(axis=1)
            order = [i for i in np.argsort(-np.linalg.norm(centres, axis=1)) if keep[i]]
            for i in order:
                height = 1.0 if static[i] else 1.5
                colour = _STATIC if static[i] else _VEHICLE
                self._draw_box(img, corners[i], height, colour)
        return img

    def _draw_box(self, img: np.ndarray, footprint: np.ndarray, height: float, colour: np.ndarray) -> None:
        """Draw a box (ego-frame footprint (4, 2), counter-clockwise or not) with back-face culling."""
        bottom = self._to_cam(footprint, 0.0)
        top = self._to_cam(footprint, height)
        faces = [top[[0, 1, 2, 3]]] + [
            np.stack([bottom[k], bottom[(k + 1) % 4], top[(k + 1) % 4], top[k]]) for k in range(4)
        ]
        shades = [1.15, 0.75, 0.9, 0.75, 0.9]
        centre = np.concatenate([bottom, top]).mean(axis=0)
        for face, shade in zip(faces, shades):
            fc = face.mean(axis=0)
            normal = fc - centre  # outward for a convex box
            if np.dot(normal, fc) >= 0:  # faces away from the camera (camera at the origin)
                continue
            polys = self._visible_polys(face[None])
            if polys:
                c = tuple(int(v) for v in np.clip(colour * shade, 0, 255))
                cv2.fillPoly(img, polys, c, cv2.LINE_8, _SHIFT)


def _box_corners(boxes: np.ndarray) -> np.ndarray:
    """(N, 5) boxes (x, y, heading, length, width) -> (N, 4, 2) corners in the same frame."""
    x, y, hd, ln, wd = (boxes[:, i] for i in range(5))
    c, s = np.cos(hd), np.sin(hd)
    local = np.array([[0.5, 0.5], [0.5, -0.5], [-0.5, -0.5], [-0.5, 0.5]])
    lx = local[None, :, 0] * ln[:, None]
    ly = local[None, :, 1] * wd[:, None]
    return np.stack(
        [x[:, None] + c[:, None] * lx - s[:, None] * ly, y[:, None] + s[:, None] * lx + c[:, None] * ly], -1
    )


def _clip_near(poly: np.ndarray, near: float) -> np.ndarray:
    """Sutherland-Hodgman clip of a (V, 3) polygon against the plane z = near (keep z >= near)."""
    out = []
    n = len(poly)
    for k in range(n):
        a, b = poly[k], poly[(k + 1) % n]
        a_in, b_in = a[2] >= near, b[2] >= near
        if a_in:
            out.append(a)
        if a_in != b_in:
            t = (near - a[2]) / (b[2] - a[2])
            out.append(a + t * (b - a))
    return np.asarray(out).reshape(-1, 3)


def _clip_segment(seg: np.ndarray, near: float) -> np.ndarray | None:
    """Clip a (2, 3) segment to z >= near; None if entirely behind."""
    a, b = seg
    if a[2] < near and b[2] < near:
        return None
    if a[2] < near:
        a = a + (near - a[2]) / (b[2] - a[2]) * (b - a)
    elif b[2] < near:
        b = b + (near - b[2]) / (a[2] - b[2]) * (a - b)
    return np.stack([a, b])
