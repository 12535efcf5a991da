"""Frames, lane walking and route polylines for the driving adapter.

Frames (used everywhere in ``sim.driving``):
    highway-env frame  What highway-env computes in: x along the road, y pointing to the RIGHT of traffic
                       driving along +x (screen-down in its renderer), heading measured from +x towards +y.
                       Only this module and the env touch it.
    world frame        x = x_hw, y = -y_hw, yaw = -heading_hw: right-handed, z up, yaw counter-clockwise
                       from +x [rad]. ``ego_state`` reports the ego pose in this frame.
    ego frame          Origin at the ego's centre (highway-env's reference point), x forward along the ego's
                       heading, y to its LEFT (ISO 8855 vehicle axes) [m]. Route points, expert waypoints,
                       surrounding agents and ``ego_delta`` are in this frame.

Lane indices are highway-env's ``(from_node, to_node, lane_id)``; a route is a list of such indices where
the lane id may be None ("any lane of that road").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

LaneIndex = tuple[str, str, int | None]


def wrap_angle(angle: float | np.ndarray) -> float | np.ndarray:
    """Wrap an angle to [-pi, pi) [rad]."""
    return (np.asarray(angle) + np.pi) % (2 * np.pi) - np.pi


def hw_to_ego(points_hw: np.ndarray, origin_hw: np.ndarray, heading_hw: float) -> np.ndarray:
    """Map points from the highway-env frame to the ego frame of a vehicle.

    Args:
        points_hw: (..., 2) float positions in the highway-env frame [m].
        origin_hw: (2,) the vehicle's position in the highway-env frame [m].
        heading_hw: The vehicle's heading in the highway-env frame [rad].

    Returns:
        (..., 2) float64 positions in the vehicle's ego frame (x forward, y left) [m].
    """
    d = np.asarray(points_hw, dtype=np.float64) - np.asarray(origin_hw, dtype=np.float64)
    c, s = np.cos(heading_hw), np.sin(heading_hw)
    x = c * d[..., 0] + s * d[..., 1]
    y_right = -s * d[..., 0] + c * d[..., 1]
    return np.stack([x, -y_right], axis=-1)


def hw_vec_to_ego(vec_hw: np.ndarray, heading_hw: float) -> np.ndarray:
    """Rotate free vectors (velocities) from the highway-env frame into an ego frame; shapes (..., 2)."""
    return hw_to_ego(vec_hw, np.zeros(2), heading_hw)


def hw_pose_to_world(position_hw: np.ndarray, heading_hw: float) -> tuple[float, float, float]:
    """Return (x, y, yaw) in the world frame for a highway-env pose (metres, radians)."""
    return float(position_hw[0]), float(-position_hw[1]), float(wrap_angle(-heading_hw))


def lane_points_ahead(
    network: Any, lane_index: LaneIndex, s0: float, distances: Sequence[float], route: Sequence | None = None
) -> np.ndarray:
    """Points on a lane centreline at given arc lengths ahead, continuing into the next lanes.

    At the end of a lane the walk continues on ``network.next_lane`` (following ``route`` where it
    applies, else the geometrically closest continuation); at a dead end the points stop at the lane end.

    Args:
        network: highway-env ``RoadNetwork``.
        lane_index: Lane to start on.
        s0: Longitudinal coordinate on that lane to start from [m].
        distances: Increasing arc lengths ahead of ``s0`` [m].
        route: Planned route (list of lane indices); copied, never mutated.

    Returns:
        (len(distances), 2) float64 positions in the highway-env frame [m].
    """
    route = list(route) if route else None
    lane = network.get_lane(lane_index)
    arc0 = -float(s0)  # arc length (from s0) at which the current lane starts
    out = np.empty((len(distances), 2))
    for i, d in enumerate(distances):
        s = d - arc0
        while s > lane.length:
            nxt = network.next_lane(lane_index, route=route, position=lane.position(lane.length, 0.0))
            if tuple(nxt) == tuple(lane_index):  # dead end: clamp at the lane end
                s = lane.length
                break
            arc0 += lane.length
            lane_index, lane = nxt, network.get_lane(nxt)
            s = d - arc0
        out[i] = lane.position(s, 0.0)
    return out


class RoutePolyline:
    """A fixed reference route: a dense centreline polyline with arc lengths, for progress measurement.

    Progress is the arc length of the ego's projection on the polyline, searched in a window around the
    previous projection so that loops (racetrack) and close parallel roads never make it jump.

    Args:
        points: (P, 2) polyline in the highway-env frame [m], P >= 2.
        length: Route length [m] that counts as 100 % completion (<= polyline length).
    """

    def __init__(self, points: np.ndarray, length: float):
        self.points = np.asarray(points, dtype=np.float64)
        seg = np.diff(self.points, axis=0)
        self._seg = seg
        self._seg_len = np.maximum(np.linalg.norm(seg, axis=1), 1e-9)
        self.s = np.concatenate([[0.0], np.cumsum(self._seg_len)])
        self.length = float(min(length, self.s[-1]))
        self._last = 0

    def reset(self) -> None:
        """Forget the previous projection (call at episode start)."""
        self._last = 0

    def project(self, position_hw: np.ndarray, back_m: float = 10.0, ahead_m: float = 60.0) -> float:
        """Arc length [m] of the point's projection, searched within [-back_m, +ahead_m] of the last one."""
        s_last = self.s[self._last]
        lo = int(np.searchsorted(self.s, s_last - back_m, side="left"))
        hi = int(np.searchsorted(self.s, s_last + ahead_m, side="right"))
        lo, hi = max(lo - 1, 0), min(max(hi, lo + 1), len(self._seg))
        p0 = self.points[lo:hi]
        seg = self._seg[lo:hi]
        t = np.clip(
            np.einsum("ij,ij->i", np.asarray(position_hw) - p0, seg) / self._seg_len[lo:hi] ** 2, 0, 1
        )
        foot = p0 + t[:, None] * seg
        k = int(np.argmin(np.linalg.norm(foot - position_hw, axis=1)))
        self._last = lo + k
        return float(self.s[lo + k] + t[k] * self._seg_len[lo + k])

    @classmethod
    def from_lanes(
        cls,
        network: Any,
        lane_index: LaneIndex,
        s0: float,
        route: Sequence | None,
        max_length: float,
        goal_s: float | None = None,
        step: float = 1.0,
    ) -> RoutePolyline:
        """Walk the route's lanes from ``(lane_index, s0)`` and sample its centreline every ``step`` m.

        With ``route`` the walk follows it and stops ``goal_s`` metres into the route's last road
        (route completion = reaching that point). Without, it follows the road for ``max_length`` m.
        """
        route = list(route) if route else None
        last_road = tuple(route[-1][:2]) if route else None
        points, total = [], 0.0
        lane = network.get_lane(lane_index)
        s = s0
        while total < max_length:
            on_last = last_road is not None and tuple(lane_index[:2]) == last_road
            s_end = min(lane.length, goal_s) if on_last and goal_s is not None else lane.length
            ss = np.arange(s, s_end, step)
            points.extend(lane.position(float(x), 0.0) for x in ss)
            total += max(s_end - s, 0.0)
            if on_last:
                points.append(lane.position(s_end, 0.0))
                break
            nxt = network.next_lane(lane_index, route=route, position=lane.position(lane.length, 0.0))
            if nxt == lane_index:
                points.append(lane.position(lane.length, 0.0))
                break
            lane_index, lane, s = nxt, network.get_lane(nxt), 0.0
        pts = np.asarray(points)
        keep = np.concatenate([[True], np.linalg.norm(np.diff(pts, axis=0), axis=1) > 1e-6])
        return cls(pts[keep], max_length if last_road is None else total)
