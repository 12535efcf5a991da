"""Forensics: detecting AI-generated images (Deep-VRM) — the GenImage-layout dataset and its generators."""
