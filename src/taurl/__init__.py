"""taurl: agentic RL on multi-turn, tool-using tasks."""
__version__ = "0.1.0"
