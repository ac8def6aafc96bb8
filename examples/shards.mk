# Sharded calibration: N shards in parallel with make -jN (README "Sharded calibration: merge-stats").
#   make -f shards.mk -j4 N=4 METHOD=entropy ARGS="-c calib.yaml"
# mse / percentile (one pass): each shard's histograms -> merge-stats -> calibrate --from-stats.
# entropy / max (two passes): pass 1 (max|x|) per shard -> merge-stats -> pass 2 (histograms over
# the merged ranges) per shard -> merge-stats -> calibrate --from-stats; a shard's pass 1 keeps its
# decoded batches (batches-I.bin, deleted after pass 2) so that pass 2 does not decode the images
# again (samples x input size on disk; 224x224x3 float32: 0.6 MB a sample).
# Either way the cache equals a single run's, byte for byte.
N      ?= 4
METHOD ?= mse
TRTQ   ?= trtq
ARGS   ?= -c calib.yaml
SHARDS := $(shell seq 0 $$(($(N) - 1)))
CAL    := $(TRTQ) calibrate $(ARGS) -q --method $(METHOD)

calibration.cache: stats.npz
	$(CAL) --from-stats $< -o $@

ifneq ($(filter $(METHOD),mse percentile),)
stats.npz: $(SHARDS:%=hist-%.npz)
	$(TRTQ) merge-stats -q $^ -o $@

hist-%.npz:
	$(CAL) --shard $*/$(N) --save-stats $@
else
stats.npz: $(SHARDS:%=hist-%.npz)
	$(TRTQ) merge-stats -q $^ -o $@

hist-%.npz: ranges.npz
	$(CAL) --shard $*/$(N) --ranges $< --keep-batches batches-$*.bin --save-stats $@
	rm -f batches-$*.bin

ranges.npz: $(SHARDS:%=ranges-%.npz)
	$(TRTQ) merge-stats -q $^ -o $@

ranges-%.npz:
	$(CAL) --shard $*/$(N) --keep-batches batches-$*.bin --save-stats $@
endif

.PHONY: clean
clean:
	rm -f ranges-*.npz ranges.npz hist-*.npz stats.npz batches-*.bin calibration.cache calibration.cache.json
