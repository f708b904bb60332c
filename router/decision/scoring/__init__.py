"""The parts of the kv_cost model (kv_aware, approx_kv): not policies themselves."""
