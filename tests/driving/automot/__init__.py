"""Tests of AutoMoT."""
