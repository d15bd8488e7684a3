"""What ComfyUI shows: the Sage Settings and Patch Model Attention node classes (``settings_node``,
``patch_node``), their ids and display names (``registry``), the same two nodes in ComfyUI's V3 schema
(``v3_nodes``), and the measured figures their tooltips and the README quote (``user_figures``). The
classes are thin: they validate inputs and hand over to ``nodes.patching`` and ``nodes.config.settings``.
"""
