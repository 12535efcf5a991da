"""Driving simulator adapter: highway-env scenarios behind one continuous-control env (``DrivingEnv``).

Importing this package is light (no highway-env): ``registration`` holds the scenario table and
``register()``; ``metrics`` is pure NumPy. ``env``, ``expert`` and ``render`` import highway-env / OpenCV
and load when an environment is made.

Modules:
    registration  scenario table, ``embodied/Drive-<Scenario>-v0`` ids
    env           ``DrivingEnv`` (observations, actions, info, termination)
    expert        privileged IDM + MOBIL expert, waypoint / meta-action labels, baselines
    geometry      frames (highway-env, world, ego), lane walking, route polylines
    render        BEV grid and front-camera rasterisers
    metrics       closed-loop metrics: route completion, infractions, driving score
"""
