"""AutoMoT: a mixture-of-transformers driving VLA (understanding expert = a Qwen-VL model, plus an action expert)."""
