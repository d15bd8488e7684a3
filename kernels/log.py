"""The pack's one logger. Everything logs through it so users can filter on "SageTriton"."""
import logging

logger = logging.getLogger("SageTriton")
