# Sourced by the bench/*_gpu.sh scripts, from the repository root on the device machine: ComfyUI carried as
# .comfyui, torchsde and trampoline (comfy.sample needs them) from their wheels carried in .whl/ (both
# git-ignored), and DEST, the results folder ($OUT, the device's output folder, else bench/results). Ends in bench/.
export COMFYUI_PATH="${COMFYUI_PATH:-$PWD/.comfyui}"
ls .whl/*.whl >/dev/null 2>&1 && python -m pip install -q --no-deps .whl/*.whl
DEST="$(realpath -m "${OUT:-bench/results}")"
mkdir -p "$DEST"
cd bench || exit 1
