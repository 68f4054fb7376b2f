"""DCS as a training objective: the differentiable loss (`loss.py`); the fine-tuning loop follows."""
