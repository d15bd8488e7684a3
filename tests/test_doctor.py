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


# --- Windows portable: the Triton failure classes, simulated on any machine -----------------------------

def _portable_tree(tmp_path, with_dev: bool):
    """A Windows embeddable Python's folder (ComfyUI portable's python_embeded), optionally with the
    include and libs folders users copy in."""
    import platform

    major, minor = platform.python_version_tuple()[:2]
    root = tmp_path / "python_embeded"
    root.mkdir()
    (root / f"python{major}{minor}._pth").write_text(f"python{major}{minor}.zip\n.\n")
    (root / "python.exe").write_bytes(b"")
    if with_dev:
        (root / "Include").mkdir()
        (root / "Include" / "Python.h").write_text("")
        (root / "libs").mkdir()
        (root / "libs" / f"python{major}{minor}.lib").write_bytes(b"")
    return root


def test_embedded_python_without_include_and_libs(doctor, tmp_path):
    root = _portable_tree(tmp_path, with_dev=False)
    env = doctor.probe_environment(system="Windows", python_prefix=str(root))  # the real probe, forced to win32
    assert env.python_embedded and env.python_missing_dev == ["include", "libs"]
    c = _by_name(doctor.run_checks(env))["python headers"]
    assert c.status == doctor.FAIL and "-lpython3" in c.detail and "embedded Python" in c.detail
    assert "include and libs" in c.fix and str(root) in c.fix
    assert c.line().count("fix:") == 1


def test_embedded_python_with_include_and_libs(doctor, tmp_path):
    root = _portable_tree(tmp_path, with_dev=True)
    env = doctor.probe_environment(system="Windows", python_prefix=str(root))
    assert env.python_missing_dev == []
    assert _by_name(doctor.run_checks(env))["python headers"].status == doctor.OK
    linux = doctor.probe_environment()  # on Linux the headers come from the system: not checked
    assert "python headers" not in _by_name(doctor.run_checks(linux))


# What TinyCC and triton-windows print when the launcher cannot be built (shapes of real reports).
TCC_CMD = ("CalledProcessError: Command '['C:\\\\ComfyUI_windows_portable\\\\python_embeded\\\\Lib\\\\site-packages"
           "\\\\triton\\\\runtime\\\\tcc\\\\tcc.exe', 'C:\\\\Temp\\\\tmp1\\\\main.c', "
           "'-O3', '-shared', '-o', 'main.cp312-win_amd64.pyd', '-lcuda', '-lpython312']' returned non-zero exit "
           "status 1.")
TCC_NO_HEADER = "C:/Users/me/AppData/Local/Temp/tmp1/cuda_utils.c:13: error: include file 'Python.h' not found"
TCC_NO_LIB = "tcc: error: library 'python312' not found"
TCC_UNDEFINED = "tcc: error: undefined symbol 'cuLaunchKernelEx'"


def _classify(text, env):
    from sagetriton.installer.build_diagnosis import classify_build_error

    return classify_build_error(text, env)


@pytest.mark.parametrize("text", [TCC_NO_HEADER, TCC_NO_LIB,
                                  "E:/p/python_embeded/Include/Python.h:12: error: include file 'pyconfig.h' not found",
                                  "windows_utils.py:323: UserWarning: Failed to find Python libs."])
def test_classify_missing_python_dev_files(doctor, text):
    env = _env(doctor, system="Windows", python="3.12.10", python_prefix="C:\\portable\\python_embeded")
    c = _classify(text, env)
    assert c is not None and c.status == doctor.FAIL and "include or libs" in c.detail
    assert "Python 3.12" in c.fix and "C:\\portable\\python_embeded" in c.fix


def test_classify_tinycc_command_failure_uses_the_environment(doctor):
    # triton-windows' exception names only the command: the probe's include/libs finding decides the class.
    missing = _env(doctor, system="Windows", python="3.12.10", python_missing_dev=["libs"])
    assert "include or libs" in _classify(TCC_CMD, missing).detail
    complete = _env(doctor, system="Windows", torch_version="2.15.0", triton_version="3.9.0")
    c = _classify(TCC_CMD, complete)
    assert c is not None and "TinyCC" in c.detail and "include or libs" not in c.detail
    assert 'triton-windows>=3.9,<3.10' in c.fix


def test_classify_tinycc_link_error_and_unrelated_errors(doctor):
    env = _env(doctor, system="Windows", torch_version="2.14.1")
    c = _classify(TCC_UNDEFINED, env)
    assert c.status == doctor.FAIL and "undefined symbol 'cuLaunchKernelEx'" in c.detail
    assert 'triton-windows>=3.8,<3.9' in c.fix
    assert _classify("CompilationError: at 10:4: async_copy_global_to_shared", env) is None
    assert _classify("inaccurate: cosine 0.9", env) is None


def test_install_report_prints_one_fix_line_per_failure_class(doctor, pack, capsys):
    from sagetriton.installer import cli

    env = _env(doctor, system="Windows", python="3.12.10", python_prefix="C:\\p\\python_embeded",
               python_missing_dev=["include", "libs"])
    failing = {"ok": False, "error": TCC_NO_HEADER}
    report = {"variants": {f"v{i}": {"build": failing, "selftest": {}} for i in range(5)},
              "cross_compile": {"sm89": {"ok": False, "error": TCC_UNDEFINED}}}
    cli.print_report(report, env)
    out = capsys.readouterr().out
    assert out.count("[FAIL] triton build") == 2 and out.count("fix:") == 2, out  # two classes, five variants
    assert "include and libs folders of a full Python 3.12" in out


@pytest.mark.parametrize("system,torch_version,triton_version,ok", [
    ("Windows", "2.15.0", "3.9.0.post21", True),
    ("Windows", "2.15.0", "3.8.0.post1", False),
    ("Windows", "2.11.0", "3.6.0.post26", True),
    ("Windows", "2.13.1", "3.6.0.post26", False),
    ("Linux", "2.14.1", "3.9.0", False),
    ("Linux", "2.15.0", "3.9.0", True),
])
def test_torch_triton_pairs_without_metadata(doctor, system, torch_version, triton_version, ok):
    # triton-windows is installed by hand (torch's Windows wheels name no Triton): the doctor's own table.
    env = _env(doctor, system=system, torch_cuda="12.8", torch_version=torch_version, triton_version=triton_version,
               triton_required=None)
    c = _by_name(doctor.run_checks(env))["triton"]
    assert (c.status == doctor.OK) == ok, c.line()
    if not ok:
        assert torch_version in c.detail and c.fix.startswith("pip install")
        assert ("triton-windows" in c.fix) == (system == "Windows")


def test_triton_table_agrees_with_the_installed_torch(doctor):
    import torch

    required = doctor._triton_requirement()
    mm = doctor._major_minor(torch.__version__)
    if required is None or mm not in doctor.TRITON_FOR_TORCH:
        pytest.skip(f"torch {torch.__version__} names no Triton or is not in the table")
    want = doctor.TRITON_FOR_TORCH[mm]
    assert doctor._major_minor(required.split("=")[-1]) == want, required


@pytest.mark.parametrize("name,major,minor,ok", [
    ("NVIDIA GeForce RTX 2080 Ti", 7, 5, False), ("NVIDIA GeForce GTX 1660", 7, 5, False),
    ("Tesla V100", 7, 0, False), ("NVIDIA GeForce GTX 1080", 6, 1, False),
    ("NVIDIA GeForce RTX 3060", 8, 6, True), ("NVIDIA GeForce RTX 5090", 12, 0, True),
])
def test_gpus_older_than_ampere(doctor, name, major, minor, ok):
    env = _env(doctor, torch_cuda="12.8", gpus=[doctor.GpuInfo(name, major, minor, total_memory=8 << 30)])
    c = _by_name(doctor.run_checks(env))["gpu0"]
    assert (c.status != doctor.FAIL) == ok, c.line()
    if not ok:
        assert "older than Ampere" in c.detail and f"sm{major}{minor}" in c.detail and c.fix
