# Included by CTest after the discovered tests: the scale tests start hundreds of processes each,
# so they run one at a time with nothing beside them (tests/scale_test.cpp).
set_tests_properties(
  Scale.TwoHundredSilosStraightToTheServer
  Scale.TwoHundredSilosBehindFourEdges
  Scale.TwoHundredSilosInGroupedSecureModeBehindFourEdges
  PROPERTIES RUN_SERIAL TRUE)
