"""What the kernel is asked to run, as plain data (no ComfyUI import): the user's Sage Settings choices
(``settings``), what install.py's self-test measured on this GPU (``install_report``, with safe answers when
there is no report), and the kernel config and crossover per GPU and head size made from the two
(``planner``), the one plan that both the dispatcher and ``/sage/status`` show.
"""
