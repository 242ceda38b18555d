"""A discrete-event simulator of RL pipeline schedules (virtual clock; `benchmarks/async.py
--sim`)."""

from taurl.sim.result import SimResult
from taurl.sim.schedules import KINDS, Schedule, standard_schedules
from taurl.sim.simulator import Simulation, compare, simulate
from taurl.sim.workload import EpisodePlan, Workload, draw_episode, top_share

__all__ = ["KINDS", "EpisodePlan", "Schedule", "SimResult", "Simulation", "Workload", "compare",
           "draw_episode", "simulate", "standard_schedules", "top_share"]
