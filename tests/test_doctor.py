"""install.py's environment doctor, on simulated machines (no GPU needed)."""
import pytest


@pytest.fixture
def doctor(pack):
    from sagetriton.installer import doctor

    return doctor


def _env(doctor, **kw):
    base = dict(system="Linux", python="3.11.7", torch_version="2.9.0", triton_version="3.5.0",
                triton_required="triton==3.5.0")
    base.update(kw)
    return doctor.Environment(**base)


def _by_name(checks):
    return {c.name: c for c in checks}


def test_cuda_ada_passes(doctor):
    env = _env(doctor, torch_cuda="12.8",
               gpus=[doctor.GpuInfo("NVIDIA GeForce RTX 4090", 8, 9, total_memory=24 << 30, free_memory=20 << 30)])
    checks = doctor.run_checks(env)
    c = _by_name(checks)
    assert not doctor.has_failures(checks), doctor.format_checks(checks)
    assert c["torch"].status == doctor.OK and "CUDA 12.8" in c["torch"].detail
    assert "sm89" in c["gpu0"].detail and "ada" in c["gpu0"].detail
    assert c["gpu0 memory"].status == doctor.OK
    assert "/dev/kfd" not in c  # NVIDIA: AMD device nodes are not checked


def test_rocm_rdna4_linux_passes_with_device_access(doctor):
    env = _env(doctor, torch_hip="6.4.43482", triton_required="pytorch-triton-rocm==3.5.0",
               gpus=[doctor.GpuInfo("AMD Radeon RX 9070 XT", 12, 0, "gfx1201:sramecc-:xnack-", 16 << 30, 15 << 30)],
               dev_nodes={"/dev/kfd": doctor.DevNode(True, True), "/dev/dri": doctor.DevNode(True, True),
                          "/dev/dxg": doctor.DevNode(False)},
               user_groups=["render", "video", "me"])
    checks = doctor.run_checks(env)
    c = _by_name(checks)
    assert not doctor.has_failures(checks), doctor.format_checks(checks)
    assert "ROCm/HIP 6.4" in c["torch"].detail
    assert "gfx1201" in c["gpu0"].detail and "rdna4" in c["gpu0"].detail  # from gcnArchName, not 12.0
    assert c["/dev/kfd"].status == doctor.OK and c["/dev/dri"].status == doctor.OK


def test_rocm_missing_kfd_and_groups(doctor):
    env = _env(doctor, torch_hip="6.4", gpus=[],
               dev_nodes={"/dev/kfd": doctor.DevNode(False), "/dev/dri": doctor.DevNode(True, False)},
               user_groups=["me"])
    c = _by_name(doctor.run_checks(env))
    assert c["/dev/kfd"].status == doctor.FAIL and "modprobe amdgpu" in c["/dev/kfd"].fix
    assert c["/dev/dri"].status == doctor.FAIL and "usermod -aG render,video" in c["/dev/dri"].fix
    assert c["groups"].status == doctor.WARN and "render" in c["groups"].detail
    assert c["gpu"].status == doctor.WARN and "rocminfo" in c["gpu"].fix
    text = doctor.format_checks(doctor.run_checks(env))
    assert "[FAIL] /dev/kfd" in text and "fix:" in text


def test_kfd_present_but_not_accessible(doctor):
    env = _env(doctor, torch_hip="6.4", dev_nodes={"/dev/kfd": doctor.DevNode(True, False),
                                                   "/dev/dri": doctor.DevNode(True, True)}, user_groups=["me"])
    c = _by_name(doctor.run_checks(env))
    assert c["/dev/kfd"].status == doctor.FAIL and "not read/writable" in c["/dev/kfd"].detail


def test_cpu_only_torch(doctor):
    env = _env(doctor, torch_cuda=None, torch_hip=None)
    checks = doctor.run_checks(env)
    c = _by_name(checks)
    assert c["torch"].status == doctor.WARN and "CPU-only" in c["torch"].detail
    assert c["gpu"].status == doctor.WARN and "no GPU found" in c["gpu"].detail
    assert "leaves ComfyUI's attention in place" in c["gpu"].detail
    assert not doctor.has_failures(checks)  # no GPU is a warning: the pack still loads


def test_mismatched_triton(doctor):
    env = _env(doctor, torch_cuda="12.8", triton_version="3.2.0", triton_required="triton==3.5.0",
               gpus=[doctor.GpuInfo("NVIDIA A100", 8, 0, total_memory=80 << 30, free_memory=70 << 30)])
    c = _by_name(doctor.run_checks(env))
    assert c["triton"].status == doctor.FAIL
    assert "3.2.0" in c["triton"].detail and "triton==3.5.0" in c["triton"].detail
    assert 'pip install "triton==3.5.*"' in c["triton"].fix


def test_compatible_triton_patch_release_and_rocm_package_name(doctor):
    env = _env(doctor, torch_hip="6.4", triton_version="3.5.1",
               triton_required="pytorch-triton-rocm==3.5.0+gitb1a2c3", dev_nodes={})
    assert _by_name(doctor.run_checks(env))["triton"].status == doctor.OK
    env.triton_version = "3.4.0"
    c = _by_name(doctor.run_checks(env))["triton"]
    assert c.status == doctor.FAIL and "pytorch-triton-rocm==3.5.*" in c.fix


def test_missing_triton_on_windows(doctor):
    env = _env(doctor, system="Windows", torch_cuda="12.8", triton_version=None, triton_error="ModuleNotFoundError")
    c = _by_name(doctor.run_checks(env))["triton"]
    assert c.status == doctor.FAIL and "triton-windows" in c.fix


def test_wsl2_rocm(doctor):
    gpu = doctor.GpuInfo("AMD Radeon RX 7900 XTX", 11, 0, "gfx1100", 24 << 30, 23 << 30)
    env = _env(doctor, torch_hip="6.4", wsl=True, gpus=[gpu],
               dev_nodes={"/dev/kfd": doctor.DevNode(False), "/dev/dri": doctor.DevNode(False),
                          "/dev/dxg": doctor.DevNode(True, True)})
    checks = doctor.run_checks(env)
    c = _by_name(checks)
    assert not doctor.has_failures(checks), doctor.format_checks(checks)  # no /dev/kfd on WSL2 is normal
    assert c["WSL2"].status == doctor.OK and "/dev/dxg" in c["WSL2"].detail
    assert "rdna3" in c["gpu0"].detail
    env.dev_nodes["/dev/dxg"] = doctor.DevNode(False)
    assert _by_name(doctor.run_checks(env))["WSL2"].status == doctor.FAIL
    assert "HSA runtime" not in _by_name(doctor.run_checks(env))


def test_wsl2_rocm_without_gpu_and_distro_hsa_runtime(doctor):
    env = _env(doctor, torch_hip="6.4", wsl=True, gpus=[], distro_hsa_runtime=True,
               dev_nodes={"/dev/kfd": doctor.DevNode(False), "/dev/dxg": doctor.DevNode(True, True)})
    c = _by_name(doctor.run_checks(env))
    assert c["gpu"].status == doctor.WARN and "WSL" in c["gpu"].fix
    assert c["HSA runtime"].status == doctor.WARN and "apt remove libhsa-runtime64-1" in c["HSA runtime"].fix
    assert "/dev/kfd" not in c  # not expected under WSL2


def test_env_vars_and_low_memory(doctor):
    env = _env(doctor, torch_hip="6.4", dev_nodes={"/dev/kfd": doctor.DevNode(True, True),
                                                   "/dev/dri": doctor.DevNode(True, True)},
               gpus=[doctor.GpuInfo("AMD Radeon RX 9060 XT", 12, 0, "gfx1200", 16 << 30, 200 << 20)],
               env_vars={"HSA_OVERRIDE_GFX_VERSION": "11.0.0", "HIP_PATH": "C:/HIP", "HIP_VISIBLE_DEVICES": "-1"})
    c = _by_name(doctor.run_checks(env))
    assert c["HSA_OVERRIDE_GFX_VERSION"].status == doctor.WARN and "unset" in c["HSA_OVERRIDE_GFX_VERSION"].fix
    assert c["HIP_PATH"].status == doctor.INFO and "does not need" in c["HIP_PATH"].detail
    assert c["HIP_VISIBLE_DEVICES"].status == doctor.WARN
    assert c["gpu0 memory"].status == doctor.WARN


def test_unknown_gpu_and_unwritable_cache(doctor):
    env = _env(doctor, torch_hip="6.4", triton_cache_writable=False,
               gpus=[doctor.GpuInfo("AMD Instinct MI100", 9, 0, "gfx908", 32 << 30, None)],
               dev_nodes={"/dev/kfd": doctor.DevNode(True, True), "/dev/dri": doctor.DevNode(True, True)})
    c = _by_name(doctor.run_checks(env))
    assert c["gpu0"].status == doctor.WARN and "not in the architecture table" in c["gpu0"].detail
    assert c["triton cache"].status == doctor.FAIL and "TRITON_CACHE_DIR" in c["triton cache"].fix


def test_no_torch(doctor):
    env = _env(doctor, torch_version=None, torch_error="ModuleNotFoundError: No module named 'torch'")
    checks = doctor.run_checks(env)
    c = _by_name(checks)
    assert c["torch"].status == doctor.FAIL and "No module named" in c["torch"].detail


def test_real_environment_probe_never_raises(doctor):
    env = doctor.probe_environment()  # this machine: whatever it is, it must produce check lines
    import torch

    assert env.torch_version == torch.__version__.split("+")[0]
    lines = doctor.format_checks(doctor.run_checks(env)).splitlines()
    assert any(ln.startswith("[ OK ] torch") for ln in lines)
    if not torch.cuda.is_available():
        assert any("no GPU found" in ln for ln in lines)


def test_windows_triton_hints(doctor):
    env = _env(doctor, system="Windows", torch_hip="6.5", triton_version=None)
    assert "WSL2" in _by_name(doctor.run_checks(env))["triton"].fix  # native Windows + AMD: no Triton back-end
    env = _env(doctor, system="Windows", torch_cuda="12.8", triton_version="3.3.1.post19",
               triton_required="triton==3.5.0")
    c = _by_name(doctor.run_checks(env))["triton"]
    assert c.status == doctor.FAIL and 'triton-windows>=3.5,<3.6' in c.fix
