"""Dataset renderers for perception: each module has ``make_dataset(out, n, seed, size, spp, test_fraction)``.

    normals     transparent labware path-traced with Mitsuba 3: RGB, material-changed twin, camera-frame
                normals, z-depth, masks (TransNormal)
    panoramas   equirectangular RGB + distance + semantics of indoor rooms, analytic ray caster (SoLA)
    videos      short mp4 clips of MuJoCo scenes rendered offscreen (video models)

Importing ``sim.render`` imports no renderer; Mitsuba and MuJoCo load when a module is used.
"""
