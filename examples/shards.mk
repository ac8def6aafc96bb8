# Sharded calibration: N shards in parallel with make -jN (README "Sharded calibration").
#   make -f shards.mk -j4 N=4 METHOD=entropy ARGS="-c calib.yaml"
# Pass 1 (max|x|) per shard -> merge-stats -> pass 2 (histograms over the merged ranges) per
# shard -> merge-stats -> calibrate --from-stats. The cache equals a single run's, byte for byte.
N      ?= 4
METHOD ?= entropy
TRTQ   ?= trtq
ARGS   ?= -c calib.yaml
SHARDS := $(shell seq 0 $$(($(N) - 1)))

calibration.cache: stats.npz
	$(TRTQ) calibrate $(ARGS) -q --from-stats $< --method $(METHOD) -o $@

stats.npz: $(SHARDS:%=hist-%.npz)
	$(TRTQ) merge-stats -q $^ -o $@

hist-%.npz: ranges.npz
	$(TRTQ) calibrate $(ARGS) -q --shard $*/$(N) --ranges $< --save-stats $@

ranges.npz: $(SHARDS:%=ranges-%.npz)
	$(TRTQ) merge-stats -q $^ -o $@

ranges-%.npz:
	$(TRTQ) calibrate $(ARGS) -q --shard $*/$(N) --save-stats $@

.PHONY: clean
clean:
	rm -f ranges-*.npz ranges.npz hist-*.npz stats.npz calibration.cache calibration.cache.json
