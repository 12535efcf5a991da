"""Behaviour-cloning policy (image + proprio -> action chunk); see modeling_bc.py."""
